"""A failing handler's stack trace, shortened to where it failed, for reports."""

from __future__ import annotations

import traceback

__all__ = ["TRACE_FRAMES", "last_frames"]

#: How many of the innermost frames a halted partition keeps.
TRACE_FRAMES = 8


def last_frames(error: BaseException, frames: int = TRACE_FRAMES) -> str:
    """The innermost ``frames`` frames of ``error``'s traceback and its exception line,
    formatted like Python's own traceback (without the chained exceptions)."""
    lines = traceback.format_exception(
        type(error), error, error.__traceback__, limit=-frames, chain=False
    )
    return "".join(lines).rstrip()
