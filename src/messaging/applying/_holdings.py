"""What one worker holds: its claims, the partitions of its batches in flight, and the
handovers that wait for those batches.

A partition the rebalance hands over is no longer applied from that moment; it is
released at once when no batch applies it, otherwise right after that batch has ended
(committed or not), in the thread that applied it. Nothing here waits for a batch, so a
slow batch holds only its own partitions, not the rebalance of the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from messaging.distribution._ownership import Claim

__all__ = ["Holdings"]

log = logging.getLogger("messaging.runtime.worker")

Then = Callable[[Sequence[int]], None]
"""What to do with partitions once handed over (release them), called with their numbers."""


class Holdings:
    """The claims of one consumer's worker and its batches in flight; thread-safe."""

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.lock = threading.Lock()
        """Guards :attr:`claims` (and the rest)."""
        self.claims: dict[int, Claim] = {}
        """The partitions applied here, by number."""
        self._busy: set[int] = set()
        self._leaving: dict[int, Then] = {}
        self._abandoned: dict[int, set[int]] = {}
        """Threads whose batch was abandoned: the partitions each may still free."""

    def hand_over(self, partitions: Sequence[int], then: Then | None = None) -> None:
        """Stop applying ``partitions`` now, and call ``then`` with them once no batch
        applies them: at once for those outside a batch, right after the batch ends for
        the others. Never waits for a batch."""
        with self.lock:
            for partition in partitions:
                self.claims.pop(partition, None)
            later = [p for p in partitions if p in self._busy]
            if then is not None:
                self._leaving.update(dict.fromkeys(later, then))
        now = [p for p in partitions if p not in later]
        if then is not None and now:
            then(now)

    def leaving(self) -> set[int]:
        """Partitions handed over whose batch has not ended yet."""
        with self.lock:
            return set(self._leaving)

    def idle(self) -> dict[int, Claim]:
        """The claims in no batch now."""
        with self.lock:
            return {p: c for p, c in self.claims.items() if p not in self._busy}

    def take(self, held: Mapping[int, Claim]) -> dict[int, Claim]:
        """Those of ``held`` that are still held and in no batch, marked as in a batch
        until :meth:`finish`."""
        with self.lock:
            free = {
                p: c for p, c in held.items() if p not in self._busy and self.claims.get(p) == c
            }
            self._busy.update(free)
        return free

    def abandon(self, thread: int, keep: Iterable[int]) -> None:
        """The batch applied by ``thread`` was abandoned past its apply timeout: when that
        thread finishes it, it frees only ``keep`` (the hung message's partition); the
        thread that took the batch over finishes the others."""
        with self.lock:
            self._abandoned[thread] = set(keep)

    def finish(self, partitions: Iterable[int]) -> None:
        """The batch of ``partitions`` ended: complete the handovers that waited for it.
        From the thread of an abandoned batch: only the partitions it kept."""
        due: dict[Then, list[int]] = {}
        with self.lock:
            kept = self._abandoned.pop(threading.get_ident(), None)
            for partition in partitions:
                if kept is not None and partition not in kept:
                    continue
                self._busy.discard(partition)
                then = self._leaving.pop(partition, None)
                if then is not None:
                    due.setdefault(then, []).append(partition)
        for then, handed in due.items():
            try:
                then(handed)
            except Exception:
                log.exception(
                    "consumer %s: handing over %s failed; the next rebalance round does it",
                    self.consumer,
                    handed,
                )
