"""Loaded by ``projections demo`` into its instance processes: records how long each batch
of the watched consumer took, so that the demo can state "+ one batch" as measured."""

from __future__ import annotations

import os

from messaging import hookimpl

BATCHES_ENV = "PROJECTIONS_DEMO_BATCHES"
"""The file each batch's duration (seconds, one a line) is appended to."""


@hookimpl
def projections_batch_applied(consumer: str, seconds: float) -> None:
    path = os.environ.get(BATCHES_ENV)
    if path and consumer == "ledger-balances":
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{seconds:.6f}\n".encode())  # one O_APPEND write: never interleaved
        finally:
            os.close(fd)


def longest_batch(path: str) -> float:
    """The longest batch recorded in ``path`` (0 if none)."""
    try:
        with open(path, encoding="utf-8") as stream:
            return max((float(line) for line in stream if line.endswith("\n")), default=0.0)
    except FileNotFoundError:
        return 0.0
