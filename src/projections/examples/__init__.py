"""Example applications shipped with the package."""

__all__: list[str] = []
