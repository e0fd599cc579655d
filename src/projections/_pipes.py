"""A command whose output is no longer read (``projections status | head``) ends quietly."""

from __future__ import annotations

import os
import select
import sys

EXIT_STDOUT_CLOSED = 141
"""128 + SIGPIPE: what a shell reports for a command that a closed pipe ended, as ``cat``."""


def reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader went away (not some other pipe)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or no file behind stdout
        return False


def stdout_closed() -> int:
    """The reader of stdout went away (``| head``): end quietly. Python flushes stdout
    again at exit, so it is pointed at /dev/null first (the Python docs' recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED
