"""Database outages logged by their edges: one WARNING when it goes, one INFO when it is back.

A stopped or unreachable server makes every poll, rebalance and heartbeat fail until it
returns; logging each failure would bury the one thing an operator needs ("unreachable
since T", "back after 10.1 s") under hundreds of identical tracebacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from messaging.store._retry import is_unreachable

__all__ = ["Failing", "Outage", "is_unreachable", "run_every"]

log = logging.getLogger("messaging.runtime.outage")


def _first_line(exc: BaseException) -> str:
    lines = str(exc.orig if isinstance(exc, DBAPIError) else exc).splitlines()
    return lines[0] if lines else ""


class Outage:
    """The reachability of the database as one loop (or several sharing it) sees it.

    :meth:`failed` logs a WARNING with the first error when the database becomes
    unreachable and nothing more while it stays so; :meth:`succeeded` logs one INFO
    with how long it was down when it is back. Thread-safe.
    """

    settle: float = 1.0
    """Seconds an outage lasts at least: as a server goes down, a connection opened before
    may still answer once, which must not end the outage and start another."""

    def __init__(self, who: str, what: str = "database") -> None:
        self.who = who
        self.what = what
        self._since: float | None = None
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """Whether the database is taken to be unreachable (an outage is going on)."""
        return self._since is not None

    def failed(self, exc: BaseException) -> bool:
        """Record a failure; True when it is an unreachable database (logged here, once per
        outage), False for any other error, which the caller reports itself."""
        if not is_unreachable(exc):
            return False
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                log.warning(
                    "%s: %s unreachable (%s: %s); retrying quietly until it is back",
                    self.who,
                    self.what,
                    type(exc).__name__,
                    _first_line(exc),
                )
        return True

    def succeeded(self) -> None:
        """Record a success; logs once how long the outage lasted, if there was one (and
        it began at least :attr:`settle` seconds ago; otherwise it goes on)."""
        if self._since is None:
            return
        with self._lock:
            since = self._since
            if since is None or time.monotonic() - since < self.settle:
                return  # another thread logged it meanwhile, or too early to tell
            self._since = None
        log.info(
            "%s: %s reachable again after %.1f s", self.who, self.what, time.monotonic() - since
        )


class Failing:
    """A job of one loop that may fail again and again, logged by its edges like an
    :class:`Outage`: one WARNING with the first error (no traceback) and what happens
    meanwhile, one INFO when the job works again."""

    def __init__(self, who: str, job: str, meanwhile: str) -> None:
        self.who = who
        self.job = job
        self.meanwhile = meanwhile
        self._failing = False

    def failed(self, exc: BaseException) -> None:
        """Record a failure; the first of a row is logged."""
        if not self._failing:
            self._failing = True
            log.warning(
                "%s: %s failed (%s: %s); %s",
                self.who,
                self.job,
                type(exc).__name__,
                _first_line(exc),
                self.meanwhile,
            )

    def succeeded(self) -> None:
        """Record a success; logs once that the job works again, if it failed."""
        if self._failing:
            self._failing = False
            log.info("%s: %s works again", self.who, self.job)


def run_every(
    interval: float,
    action: Callable[[], None],
    what: str,
    stop: threading.Event,
    outage: Outage,
    *,
    beat: Callable[[], None],
) -> None:
    """Run ``action`` every ``interval`` seconds until ``stop`` is set, counted from each
    round's start, so a slow round (a lock wait, a batch in flight) does not push the next
    one back. An unreachable database is logged by ``outage``, once per outage; any other
    error with its traceback (``what`` names the loop). ``beat`` is called after each
    round, failed or not."""
    due = time.monotonic() + interval
    while not stop.wait(max(0.0, due - time.monotonic())):
        due = max(due + interval, time.monotonic())
        try:
            action()
        except Exception as exc:
            if not outage.failed(exc):
                log.exception("%s failed; trying again next round", what)
        else:
            outage.succeeded()
        beat()
