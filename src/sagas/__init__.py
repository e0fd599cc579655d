"""Sagas: long-running processes with state, commands and deadlines (not built yet)."""

__all__: list[str] = []
