"""The lanes of one worker: its batches applied in parallel, none waiting for another.

A poll submits the batches of the lanes that are free and waits for them, but not for
one that stays slow (a handler that blocks, a row lock held by a frozen instance): once
a batch has ended, the others get :data:`STRAGGLER_FACTOR` times as long (at least
:data:`MIN_GRACE`), then the poll goes on, reading for the lanes that ended while the
slow one keeps its own partitions. (Waiting for lanes that are merely a little slower
keeps the reads shared: a read that leaves out a busy lane scans past its messages.)
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait

__all__ = ["MIN_GRACE", "STRAGGLER_FACTOR", "Lanes"]

STRAGGLER_FACTOR = 4
"""How many times as long as the first batch of a poll to end the others are waited for."""
MIN_GRACE = 1.0
"""Seconds the others are waited for at least: lanes of one read that end further apart
than this are not just unevenly loaded."""

_Task = tuple["Future[int]", Callable[[], int], Callable[[], object]]


class _Lane:
    """One daemon thread applying the batches given to it, one at a time (a thread of a
    batch abandoned past its apply timeout is left to its handler: never joined)."""

    def __init__(self, name: str) -> None:
        self.tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (task := self.tasks.get()) is not None:
            future, batch, ended = task
            if not future.set_running_or_notify_cancel():
                continue
            error: BaseException | None = None
            try:
                result = batch()
            except BaseException as exc:
                result, error = 0, exc
            try:
                ended()  # before the future is done: its partitions are free by then
            finally:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)


class Lanes:
    """Runs up to ``count`` lane batches of one worker at once, on threads of their own."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._idle: list[_Lane] = []
        self._running: dict[Future[int], _Lane] = {}
        self._lock = threading.Lock()
        """Guards :attr:`_running` (a batch is abandoned from another thread)."""
        self._made = 0

    def submit(self, batch: Callable[[], int], ended: Callable[[], object]) -> None:
        """Start applying ``batch``, which returns how many messages it applied; call
        ``ended`` once it has, whatever the outcome (in the batch's thread)."""
        if self._idle:
            lane = self._idle.pop()
        else:
            self._made += 1
            lane = _Lane(f"{threading.current_thread().name}/lane{self._made}")
        future: Future[int] = Future()
        with self._lock:
            self._running[future] = lane
        lane.tasks.put((future, batch, ended))

    def abandon(self, thread: int) -> None:
        """The batch applied by ``thread`` was abandoned past its apply timeout: count it
        no more (its lane is never used again, a new one takes its place)."""
        with self._lock:
            for future, lane in list(self._running.items()):
                if lane.thread.ident == thread:
                    del self._running[future]
                    lane.tasks.put(None)  # ends the thread should its batch ever return

    def free(self) -> int:
        """How many more batches could start now."""
        with self._lock:
            return self.count - len(self._running)

    def running(self) -> bool:
        """Whether a batch is being applied."""
        with self._lock:
            return bool(self._running)

    def wait(self, idle: float) -> int | None:
        """Wait up to ``idle`` seconds for a running batch to end, then for the others (see
        the module). Returns how many messages the batches that ended applied, or None when
        none ended; re-raises the first failure among them."""
        began = time.monotonic()
        with self._lock:
            running = set(self._running)
        done, pending = wait(running, timeout=idle, return_when=FIRST_COMPLETED)
        if not done:
            return None
        if pending:
            took = time.monotonic() - began
            grace = max(STRAGGLER_FACTOR * took, MIN_GRACE)
            wait(pending, timeout=grace, return_when=ALL_COMPLETED)
        with self._lock:
            ended = {future: lane for future, lane in self._running.items() if future.done()}
            for future in ended:
                del self._running[future]
        self._idle.extend(ended.values())
        for future in ended:
            error = future.exception()
            if error is not None:
                raise error
        return sum(future.result() for future in ended)

    def shutdown(self) -> None:
        """Wait for the running batches to end, then stop the threads."""
        with self._lock:
            running = dict(self._running)
            self._running.clear()
        wait(running)
        for lane in [*self._idle, *running.values()]:
            lane.tasks.put(None)
        self._idle.clear()
