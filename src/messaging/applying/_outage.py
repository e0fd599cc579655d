"""Database outages logged by their edges: one WARNING when it goes, one INFO when it is back.

A stopped or unreachable server makes every poll, rebalance and heartbeat fail until it
returns; logging each failure would bury the one thing an operator needs ("unreachable
since T", "back after 10.1 s") under hundreds of identical tracebacks.

A database that refuses writes (a full disk, a read-only file or server:
:mod:`messaging.store._refusals`) is an outage too, said in words a user acts on.

Connections lost by an instance that went without a heartbeat past stale-instance-timeout
(frozen, paused, or cut off by a network that came back) are no outage: the instance that
took over its partitions ended its sessions (:mod:`messaging.store._sessions`), and new
ones work at once. That is said once instead (:class:`Heartbeats`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from messaging.store._refusals import refusal, refusal_words
from messaging.store._retry import is_ambiguous, is_unreachable

__all__ = ["Failing", "Heartbeats", "Outage", "is_unreachable", "run_every"]

log = logging.getLogger("messaging.runtime.outage")


def _first_line(exc: BaseException) -> str:
    lines = str(exc.orig if isinstance(exc, DBAPIError) else exc).splitlines()
    return lines[0] if lines else ""


class Heartbeats:
    """When an instance's heartbeat last went through: a gap past ``stale_instance_timeout``
    means its peers took it for stale, and the one taking over its partitions ended its
    database sessions. Every connection of ``engine`` lost during such a gap (retried or
    not, in any loop) is taken for one of those, and said once per gap. Thread-safe."""

    def __init__(
        self, name: str, stale_instance_timeout: float, engine: Engine | None = None
    ) -> None:
        self.name = name
        self.timeout = stale_instance_timeout
        self._last: float | None = None
        """When the last heartbeat that went through was sent (None: none yet, or stopped):
        no later than the time its row records, however late its answer came."""
        self._done: float | None = None
        """When the last heartbeat's answer came."""
        self._sent: float | None = None
        """When the first heartbeat not answered yet was sent (None: every one was)."""
        self._gap: tuple[float, float] | None = None
        """The last gap past the timeout that a heartbeat ended: its start and end."""
        self._told: float | None = None
        """The start of the gap whose ended sessions were told."""
        self._lock = threading.Lock()
        self._engine = engine
        self.url: URL | None = None if engine is None else engine.url
        """The database's URL, to say which disk or server refuses writes."""
        if engine is not None:
            event.listen(engine, "invalidate", self._invalidated)

    def close(self) -> None:
        """Stop judging: the instance stops, and its heartbeats with it."""
        with self._lock:
            self._last = self._done = self._gap = self._sent = None
        if self._engine is not None:
            event.remove(self._engine, "invalidate", self._invalidated)
            self._engine = None

    def beat(self, sent: float) -> None:
        """Record a heartbeat that went through, sent at ``sent`` (monotonic): the peers
        judge staleness by the time its row records, so a gap is measured from when it was
        sent, not from its answer (a slow answer would hide part of a gap they saw)."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last > self.timeout:
                self._gap = (self._last, now)
            self._last, self._done, self._sent = sent, now, None

    def sending(self) -> None:
        """A heartbeat is on its way: unanswered until one goes through (:meth:`beat`)."""
        with self._lock:
            if self._sent is None:
                self._sent = time.monotonic()

    def unanswered(self) -> float:
        """Seconds since the first heartbeat not answered yet was sent (0: none waits),
        failed attempts and retries included: read from memory, never from the database."""
        sent = self._sent
        return 0.0 if sent is None else max(0.0, time.monotonic() - sent)

    def beaten_since(self, moment: float) -> bool:
        """Whether a heartbeat (a write) went through after ``moment`` (monotonic)."""
        done = self._done
        return done is not None and done > moment

    def sessions_ended(self, exc: BaseException) -> bool:
        """Whether ``exc``, a lost connection, comes from sessions ended by the instance
        that took over during a gap past the timeout (said once per gap)."""
        return is_ambiguous(exc) and self._lost_while_stale(exc)

    def _invalidated(self, _dbapi: object, _record: object, exc: BaseException | None) -> None:
        """A connection of the pool found gone, by whichever thread."""
        if exc is not None:
            self._lost_while_stale(exc)

    def _lost_while_stale(self, exc: BaseException) -> bool:
        with self._lock:
            gap = self._stale_gap(time.monotonic())
            if gap is None:
                return False
            start, length = gap
            if self._told != start:
                self._told = start
                log.warning(
                    "instance %s: no heartbeat for %.1f s, past stale-instance-timeout (%g s): "
                    "taken for stale, its database sessions were ended by the instance that "
                    "took over its partitions (%s: %s); reconnecting",
                    self.name,
                    length,
                    self.timeout,
                    type(exc).__name__,
                    _first_line(exc),
                )
        return True

    def _stale_gap(self, now: float) -> tuple[float, float] | None:
        """The gap past the timeout going on now, or the last one if it ended within the
        timeout (after a freeze the loops wake in any order): its start and length."""
        if self._last is not None and now - self._last > self.timeout:
            return self._last, now - self._last
        if self._gap is not None and now - self._gap[1] <= self.timeout:
            return self._gap[0], self._gap[1] - self._gap[0]
        return None


class Outage:
    """The reachability of the database as one loop (or several sharing it) sees it.

    :meth:`failed` logs a WARNING with the first error when the database becomes
    unreachable and nothing more while it stays so; :meth:`succeeded` logs one INFO
    with how long it was down when it is back. Lost connections of an instance taken for
    stale (``heartbeats``) start no outage unless failures go on for :attr:`settle`
    seconds. Thread-safe.
    """

    settle: float = 1.0
    """Seconds an outage lasts at least: as a server goes down, a connection opened before
    may still answer once, which must not end the outage and start another."""

    def __init__(
        self, who: str, heartbeats: Heartbeats | None = None, what: str = "database"
    ) -> None:
        self.who = who
        self.what = what
        self.heartbeats = heartbeats
        self.cause: str | None = None
        """What the outage going on is, in words (None: none is)."""
        self._refused = False
        self._since: float | None = None
        self._quiet = False
        """The failures so far were sessions ended by a successor, not an outage."""
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """Whether the database is taken to be unreachable (an outage is going on)."""
        return self._since is not None

    def failed(self, exc: BaseException) -> bool:
        """Record a failure; True when it is an unreachable database or one that refuses
        writes (logged here, once per outage), False for any other error, which the caller
        reports itself."""
        kind = refusal(exc)
        if kind is None and not is_unreachable(exc):
            return False
        with self._lock:
            now = time.monotonic()
            if self._since is None:
                self._since = now
                self._refused = kind is not None
                if kind is None:
                    self.cause = f"the {self.what} is unreachable"
                else:
                    url = self.heartbeats.url if self.heartbeats is not None else None
                    self.cause = f"the {self.what} refuses writes: {refusal_words(kind, url)}"
                self._quiet = (
                    kind is None
                    and self.heartbeats is not None
                    and self.heartbeats.sessions_ended(exc)
                )
                if not self._quiet:
                    self._unreachable(exc)
            elif self._quiet and now - self._since >= self.settle:
                self._quiet = False  # new sessions fail too: the database is unreachable
                self._unreachable(exc)
        return True

    def _unreachable(self, exc: BaseException) -> None:
        if self._refused:
            log.warning(
                "%s: %s; retrying quietly until it takes writes again (%s: %s)",
                self.who,
                self.cause,
                type(exc).__name__,
                _first_line(exc),
            )
            return
        log.warning(
            "%s: %s unreachable (%s: %s); retrying quietly until it is back",
            self.who,
            self.what,
            type(exc).__name__,
            _first_line(exc),
        )

    def succeeded(self, *, wrote: bool = True) -> None:
        """Record a success; logs once how long the outage lasted, if there was one (and
        it began at least :attr:`settle` seconds ago; otherwise it goes on). A success that
        may not have written (``wrote=False``: a read) ends a refusal of writes only if a
        heartbeat went through since it began."""
        since = self._since
        if since is None:
            return
        writes = wrote or (self.heartbeats is not None and self.heartbeats.beaten_since(since))
        if self._refused and not writes:
            return
        with self._lock:
            since = self._since
            if since is None or time.monotonic() - since < self.settle:
                return  # another thread logged it meanwhile, or too early to tell
            self._since = self.cause = None
            if self._quiet:
                return
        back = "takes writes" if self._refused else "reachable"
        log.info(
            "%s: %s %s again after %.1f s", self.who, self.what, back, time.monotonic() - since
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
    soon: threading.Event | None = None,
) -> None:
    """Run ``action`` every ``interval`` seconds until ``stop`` is set, counted from each
    round's start, so a slow round (a lock wait, a batch in flight) does not push the next
    one back; and early whenever ``soon`` is set (whoever sets ``stop`` sets it too), but
    not sooner than a quarter ``interval`` after the previous round. An
    unreachable database is logged by ``outage``, once per outage; any other error with its
    traceback (``what`` names the loop). ``beat`` is called after each round, failed or not."""
    due = time.monotonic() + interval
    earliest = time.monotonic() + interval / 4
    while not _stopped(stop, soon, due, earliest):
        earliest = time.monotonic() + interval / 4
        if time.monotonic() >= due:
            due = max(due + interval, time.monotonic())
        try:
            action()
        except Exception as exc:
            if not outage.failed(exc):
                log.exception("%s failed; trying again next round", what)
        else:
            outage.succeeded()
        beat()


def _stopped(
    stop: threading.Event, soon: threading.Event | None, due: float, earliest: float
) -> bool:
    """Wait for ``stop`` until ``due``, or until ``soon`` is set (then cleared) but not
    before ``earliest`` (monotonic times); whether stopped."""
    if soon is None:
        return stop.wait(max(0.0, due - time.monotonic()))
    soon.wait(max(0.0, due - time.monotonic()))
    soon.clear()
    return stop.wait(max(0.0, min(due, earliest) - time.monotonic()))
