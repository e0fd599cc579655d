"""The apply timeout: a bound on one batch's transaction, from its first handler call to
its commit (``apply-timeout``, per consumer).

Each batch runs under a :class:`Deadline`, registered with the instance's
:class:`ApplyDeadlines`, which its :class:`~messaging.runtime._watchdog.Watchdog` looks at
once a second. Past the deadline:

- **a statement that is running is interrupted** from the watchdog's thread: on
  MySQL/MariaDB by ``KILL QUERY`` of the batch's session from another connection (only
  while the batch's thread waits for the server, so no later statement is hit), on SQLite
  by ``sqlite3.Connection.interrupt`` (a no-op between statements);
- **the batch's thread checks the deadline** after each message and before the commit, so
  a handler busy in Python (which nothing outside can interrupt) fails as it returns.

Either way the batch is rolled back and the message being handled fails with
:class:`~messaging._errors.ApplyTimedOut`, like a poison message: its partition halts
there, or its source is parked (``on-failure``). The deadline ends before the commit, so a
commit is never interrupted.

A batch whose deadline has an ``abandon`` action is not waited for: at the watchdog's
first look past the deadline the batch is **abandoned** (the action runs, and another
thread takes over its partitions: the hung message's partition is failed there, the
others are applied again at once). Whether the batch's thread then returns soon or never,
it commits nothing: leaving :meth:`ApplyDeadlines.bound` raises :class:`Abandoned`. The
check and the abandonment are one under the deadlines' lock, so exactly one of the two
goes on with the batch.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
from sqlalchemy import Connection

from messaging._errors import ApplyTimedOut
from messaging._settings import format_duration

__all__ = [
    "NO_DEADLINE",
    "STUCK_GRACE",
    "Abandoned",
    "ApplyDeadlines",
    "Deadline",
    "Stuck",
    "batch_name",
]

STUCK_GRACE = 10.0
"""Seconds past its apply timeout (or as long again as the timeout, if shorter) after
which a batch that still runs makes its instance not live."""

log = logging.getLogger("messaging.runtime.watchdog")


class Abandoned(Exception):
    """A batch given up past its apply timeout: another thread took its partitions over,
    so its own thread, once it returns, commits nothing and ends."""


class Deadline:
    """When one batch must have finished applying (``timeout`` None: never)."""

    def __init__(
        self,
        timeout: float | None,
        what: str = "",
        interrupt: Callable[[], None] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        consumer: str = "",
        partitions: tuple[int, ...] = (),
    ) -> None:
        self.timeout = timeout
        self.what = what
        self.consumer, self.partitions = consumer, partitions
        self.at = math.inf if timeout is None else clock() + timeout
        self.interrupt = interrupt
        """Ends the batch's running statement (None: nothing to interrupt)."""
        self.waits_only = False
        """Interrupt only while the batch's thread waits for the server (MySQL/MariaDB)."""
        self.thread = threading.get_ident()
        self.expired = False
        """Set by the watchdog once it saw the deadline pass."""
        self.where = ""
        """Where its thread was when the watchdog saw the deadline pass (for the probes)."""
        self.clock = clock
        self.abandon: Callable[[Deadline], None] | None = None
        """What takes the batch over once past the deadline (None: it is waited for)."""
        self.abandoned = False
        """Set (under the deadlines' lock) once :attr:`abandon` ran."""

    def passed(self) -> bool:
        """Whether the batch is past its deadline."""
        return self.expired or self.clock() > self.at

    def error(self, position: int) -> ApplyTimedOut:
        """The failure of the message at ``position``, handled when the deadline passed."""
        return ApplyTimedOut(format_duration(self.timeout or 0.0), position)

    def check(self, position: int) -> None:
        """Raise :meth:`error` if the deadline passed."""
        if self.passed():
            raise self.error(position)


NO_DEADLINE = Deadline(None)
"""The deadline of a context applied outside a bounded batch."""


@attrs.frozen(order=True)
class Stuck:
    """A batch running past its apply timeout by as long again (at most
    :data:`STUCK_GRACE`): what the liveness probe and the instance's row say of it."""

    consumer: str
    partitions: tuple[int, ...]
    timeout: float
    over: float
    """Seconds past its deadline."""
    where: str
    """Where its thread is: the handler's function, file and line first."""

    def __str__(self) -> str:
        return (
            f"{batch_name(self.consumer, self.partitions)} is stuck past its apply timeout "
            f"({format_duration(self.timeout)}) for {self.over:.1f} s in {self.where}"
        )


class ApplyDeadlines:
    """The deadlines of the batches being applied in one instance."""

    def __init__(self, who: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.who = who
        self._clock = clock
        self._running: set[Deadline] = set()
        self._lock = threading.Lock()
        """Held while a statement is interrupted, so its batch cannot end meanwhile (and
        its connection serve another)."""

    @contextmanager
    def bound(
        self,
        conn: Connection,
        timeout: float | None,
        consumer: str,
        partitions: Iterable[int],
        abandon: Callable[[Deadline], None] | None = None,
    ) -> Iterator[Deadline]:
        """Apply a batch of ``consumer``'s ``partitions`` within ``timeout`` seconds on
        ``conn``; the deadline no longer holds once the block is left. With ``abandon``,
        the batch is abandoned at the first look past its deadline (see the module):
        leaving the block then raises :class:`Abandoned`, whatever happened in it."""
        if timeout is None:
            yield NO_DEADLINE
            return
        held = tuple(sorted(partitions))
        deadline = Deadline(
            timeout,
            batch_name(consumer, held),
            _interrupter(conn),
            clock=self._clock,
            consumer=consumer,
            partitions=held,
        )
        deadline.waits_only = conn.dialect.name != "sqlite"
        deadline.abandon = abandon
        with self._lock:
            self._running.add(deadline)
        try:
            yield deadline
        finally:
            with self._lock:
                self._running.discard(deadline)
                abandoned = deadline.abandoned
            if abandoned:
                raise Abandoned(f"{deadline.what} was abandoned past its apply timeout")

    def stuck_batches(self) -> list[Stuck]:
        """The batches still running past their apply timeout by as long again (at most
        :data:`STUCK_GRACE`): a handler that does not return, which nothing in the
        instance can end (its instance is no longer live, so that it is restarted)."""
        now = self._clock()
        with self._lock:
            late = [d for d in self._running if d.timeout is not None and d.expired]
        return sorted(
            Stuck(d.consumer, d.partitions, d.timeout, round(now - d.at, 1), d.where)
            for d in late
            if d.timeout is not None and now - d.at > min(d.timeout, STUCK_GRACE)
        )

    def stuck(self) -> list[str]:
        """:meth:`stuck_batches` in words, for the liveness probe."""
        return [str(batch) for batch in self.stuck_batches()]

    def look(self, waiting: Collection[int], where: Callable[[int], str]) -> None:
        """One look (by the watchdog): interrupt the running statement of each batch past
        its deadline; ``waiting``: the threads waiting for a MySQL/MariaDB server now;
        ``where``: where a thread is, for the log."""
        now = self._clock()
        with self._lock:
            for deadline in [d for d in self._running if now > d.at]:
                if not deadline.expired:
                    deadline.expired = True
                    deadline.where = where(deadline.thread)
                    log.warning(
                        "%s: %s is past its apply timeout (%s) in %s; it fails and is "
                        "rolled back (a handler busy in Python fails as it returns)",
                        self.who,
                        deadline.what,
                        format_duration(deadline.timeout or 0.0),
                        deadline.where,
                    )
                if deadline.abandon is not None and not deadline.abandoned:
                    deadline.abandoned = True
                    try:
                        deadline.abandon(deadline)
                    except Exception:
                        log.exception("%s: could not take over %s", self.who, deadline.what)
                if deadline.waits_only and deadline.thread not in waiting:
                    continue
                try:
                    if deadline.interrupt is not None:
                        deadline.interrupt()
                except Exception as exc:  # the batch still fails when its thread returns
                    log.warning("%s: could not interrupt %s: %s", self.who, deadline.what, exc)


def batch_name(consumer: str, partitions: Iterable[int]) -> str:
    """How the log names a batch of ``consumer`` applying ``partitions``."""
    return f"a batch of consumer {consumer} (partitions {','.join(map(str, sorted(partitions)))})"


def _interrupter(conn: Connection) -> Callable[[], None]:
    """What ends the statement ``conn`` runs now, called from another thread."""
    raw: Any = conn.connection.dbapi_connection
    if conn.dialect.name == "sqlite":
        return raw.interrupt  # type: ignore[no-any-return]
    session = int(raw.thread_id())
    engine = conn.engine

    def kill() -> None:
        with engine.connect() as other:
            other.exec_driver_sql(f"KILL QUERY {session}")

    return kill
