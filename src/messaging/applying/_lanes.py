"""The lanes of one worker: its batches applied in parallel, none waiting for another.

A poll submits the batches of the lanes that are free and waits for them, but not for
one that stays slow (a handler that blocks, a row lock held by a frozen instance): once
a batch has ended, the others get :data:`STRAGGLER_FACTOR` times as long (at least
:data:`MIN_GRACE`), then the poll goes on, reading for the lanes that ended while the
slow one keeps its own partitions. (Waiting for lanes that are merely a little slower
keeps the reads shared: a read that leaves out a busy lane scans past its messages.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

__all__ = ["MIN_GRACE", "STRAGGLER_FACTOR", "Lanes"]

STRAGGLER_FACTOR = 4
"""How many times as long as the first batch of a poll to end the others are waited for."""
MIN_GRACE = 1.0
"""Seconds the others are waited for at least: lanes of one read that end further apart
than this are not just unevenly loaded."""


class Lanes:
    """Runs up to ``count`` lane batches of one worker at once, on threads of their own."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._pool: ThreadPoolExecutor | None = None
        self._running: set[Future[int]] = set()

    def submit(self, batch: Callable[[], int], ended: Callable[[], object]) -> None:
        """Start applying ``batch``, which returns how many messages it applied; call
        ``ended`` once it has, whatever the outcome."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.count, thread_name_prefix=f"{threading.current_thread().name}/lane"
            )
        self._running.add(self._pool.submit(_then, batch, ended))

    def free(self) -> int:
        """How many more batches could start now."""
        return self.count - len(self._running)

    def running(self) -> bool:
        """Whether a batch is being applied."""
        return bool(self._running)

    def wait(self, idle: float) -> int | None:
        """Wait up to ``idle`` seconds for a running batch to end, then for the others (see
        the module). Returns how many messages the batches that ended applied, or None when
        none ended; re-raises the first failure among them."""
        began = time.monotonic()
        done, pending = wait(self._running, timeout=idle, return_when=FIRST_COMPLETED)
        if not done:
            return None
        if pending:
            took = time.monotonic() - began
            grace = max(STRAGGLER_FACTOR * took, MIN_GRACE)
            wait(pending, timeout=grace, return_when=ALL_COMPLETED)
        ended = {future for future in self._running if future.done()}
        self._running -= ended
        for future in ended:
            error = future.exception()
            if error is not None:
                raise error
        return sum(future.result() for future in ended)

    def shutdown(self) -> None:
        """Wait for the running batches to end, then stop the threads."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._running.clear()


def _then(batch: Callable[[], int], ended: Callable[[], object]) -> int:
    try:
        return batch()
    finally:
        ended()
