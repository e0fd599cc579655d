"""Read your own writes: wait until consumers have applied a consistency token.

:func:`wait_for` (and :func:`wait_for_async`) checks the database
(:func:`~messaging.waits._progress.progress`) until every partition of the consumers
that the token's messages fall into has committed a checkpoint past them: a new
connection then sees the read model's transaction. Between checks it waits from 2 ms,
doubling up to ``poll_interval``; a transient database error (a lock conflict, a lost
connection) is checked again until the timeout. A halted or paused partition behind the
token, a rolled-back position or an unknown consumer raise at once
(:class:`~messaging._errors.WaitRefused`); a timeout raises
:class:`~messaging._errors.WaitTimeout` naming what is still behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from messaging._connection import database_for
from messaging._consumers import ConsumerSpec
from messaging._errors import WaitTimeout
from messaging._settings import Settings
from messaging.store._database import Database
from messaging.store._retry import is_transient
from messaging.store._tokens import ConsistencyToken
from messaging.waits._progress import Progress, copy_progress, progress
from messaging.waits._watcher import Watch, wait_watched, watcher_for

__all__ = ["MAX_TIMEOUT", "wait_for", "wait_for_async", "wait_for_copy"]

MAX_TIMEOUT = 3600.0
"""The longest timeout a wait takes, in seconds."""
FIRST_PAUSE = 0.002
"""Seconds between the first checks; doubled after each, up to ``poll_interval``."""
MAX_HEAD_START = 0.25
"""Seconds before its deadline a wait's final check starts, at most."""
FINAL_GRACE = 0.025
"""Seconds past its deadline a wait waits for its final check before it raises without."""
_FINAL_TAKES = [0.01]
"""Seconds the slowest recent final check of this process's waits took (each newer one
weighs it down by 5 %): the shared watcher's wait ends half as much again before the
deadline, so that the check ends before it even when the machine is loaded."""


def _record_take(seconds: float) -> None:
    _FINAL_TAKES[0] = max(seconds, 0.95 * _FINAL_TAKES[0])


def wait_for(
    target: Database | Settings,
    token: ConsistencyToken | str,
    consumer: str | Sequence[str],
    *,
    timeout: float = 10.0,
    fail_fast: bool = False,
    poll_interval: float = 0.05,
) -> Progress:
    """Wait until ``consumer`` (a name or several) has applied ``token`` (an append's
    ``.token`` or its text) in ``target`` (a database, or settings naming one); return
    the :class:`~messaging.waits._progress.Progress`, applied.

    ``fail_fast``: check once and return the progress even when not applied (its
    ``behind`` says what is left). Otherwise raise :class:`WaitTimeout` after ``timeout``
    seconds. Raises :class:`~messaging._errors.WaitRefused` at once when waiting cannot
    help (see the module), :class:`~messaging.store._tokens.InvalidToken` (a ValueError)
    for a malformed token or one of another tenant, ValueError for a bad timeout or name.
    """
    waiter = Waiter(token, consumer, timeout, fail_fast, poll_interval)
    db, owned = _database(target)
    try:
        result = waiter.run(db) if fail_fast else waiter.watched(db)
        assert result is not None  # nothing cancels it
        return result
    finally:
        if owned:
            db.dispose()


async def wait_for_async(
    target: Database | Settings,
    token: ConsistencyToken | str,
    consumer: str | Sequence[str],
    *,
    timeout: float = 10.0,
    fail_fast: bool = False,
    poll_interval: float = 0.05,
) -> Progress:
    """:func:`wait_for` for asyncio: the shared watcher checks, the event loop waits for
    it (no thread per wait); cancelling the task ends the wait."""
    waiter = Waiter(token, consumer, timeout, fail_fast, poll_interval)
    db, owned = _database(target)
    try:
        if fail_fast:
            checked = await asyncio.to_thread(waiter.check, db)
            assert checked is not None  # fail_fast: answered by the first check
            return checked
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not finished.done():
                finished.set_result(None)

        def done() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle)

        watch = waiter.watch(on_done=done)
        watcher = watcher_for(db)
        watcher.add(watch)
        try:
            left = waiter.deadline - waiter.head_start() - time.monotonic()
            await asyncio.wait({finished}, timeout=max(0.0, left))
        finally:
            watcher.remove(watch)
        if watch.done.is_set():
            return waiter.outcome(watch)
        waiter.last = watch.last
        return await asyncio.to_thread(waiter.final, db)
    finally:
        if owned:
            db.dispose()


class _Types(Protocol):
    @property
    def type_names(self) -> Sequence[str]: ...


class Copy(Protocol):
    """An instance's copy of an in-memory consumer, as a wait reads it."""

    @property
    def spec(self) -> ConsumerSpec: ...

    @property
    def dispatcher(self) -> _Types: ...

    @property
    def position(self) -> int: ...

    @property
    def state(self) -> object: ...


class Copies(Protocol):
    """What runs copies of in-memory consumers: an :class:`~messaging.Instance`."""

    @property
    def db(self) -> Database: ...

    @property
    def in_memory(self) -> Mapping[str, Copy]: ...


def wait_for_copy(
    instance: Copies,
    token: ConsistencyToken | str,
    consumer: str,
    *,
    timeout: float = 10.0,
    fail_fast: bool = False,
    poll_interval: float = 0.05,
) -> Progress:
    """:func:`wait_for` for ``instance``'s own copy of the in-memory consumer ``consumer``
    (each instance runs its own, at its own pace): until that copy has applied ``token``.
    A halted or paused copy behind it is refused; another consumer is a ValueError."""
    copy = instance.in_memory.get(consumer)
    if copy is None:
        known = ", ".join(sorted(instance.in_memory)) or "none"
        raise ValueError(f"{consumer!r} is not an in-memory consumer of this instance ({known})")
    waiter = _CopyWaiter(token, consumer, timeout, fail_fast, poll_interval)
    waiter.copy = copy
    result = waiter.run(instance.db)
    assert result is not None  # nothing cancels it
    return result


def check_timeout(timeout: object, what: str = "timeout") -> float:
    """``timeout`` as seconds; ValueError unless a number from 0 to :data:`MAX_TIMEOUT`."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError(f"{what} must be a number of seconds, got {timeout!r}")
    if not (math.isfinite(timeout) and 0 <= timeout <= MAX_TIMEOUT):
        raise ValueError(f"{what} must be from 0 to {MAX_TIMEOUT:g} seconds, got {timeout!r}")
    return float(timeout)


def consumer_names(consumer: str | Sequence[str]) -> list[str]:
    """The consumer names of a wait; ValueError for none or an empty one."""
    names = [consumer] if isinstance(consumer, str) else list(consumer)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"consumer must be a non-empty name or list of names, got {consumer!r}")
    return list(dict.fromkeys(names))


class Waiter:
    """One wait's arguments, deadline and pauses."""

    def __init__(
        self,
        token: ConsistencyToken | str,
        consumer: str | Sequence[str],
        timeout: float,
        fail_fast: bool,
        poll_interval: float,
    ) -> None:
        self.token = token if isinstance(token, ConsistencyToken) else ConsistencyToken.parse(token)
        self.consumers = consumer_names(consumer)
        self.timeout = check_timeout(timeout)
        self.poll_interval = check_timeout(poll_interval, "poll_interval") or FIRST_PAUSE
        self.fail_fast = fail_fast
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout
        self._pause = FIRST_PAUSE
        self.last: Progress | None = None
        """What the watcher's last check found (not applied), if it made one."""

    def check(self, db: Database) -> Progress | None:
        """The progress when the wait is over (applied, or ``fail_fast``); None to check
        again; :class:`WaitTimeout` once the deadline passed."""
        last = self.fail_fast or time.monotonic() >= self.deadline
        try:
            found = self.read(db, last)
        except Exception as exc:
            if not is_transient(exc) or self.fail_fast:
                raise
            found = None
            if last:
                raise WaitTimeout(self.timeout, [f"the database did not answer: {exc}"]) from exc
        if found is not None and (found.applied or self.fail_fast):
            return found
        if last:
            assert found is not None
            raise WaitTimeout(max(self.timeout, time.monotonic() - self.started), found.behind)
        return None

    def run(self, db: Database, cancelled: Callable[[], bool] | None = None) -> Progress | None:
        """Check until the wait is over; None as soon as ``cancelled()`` (asked before
        each pause) is true."""
        while True:
            result = self.check(db)
            if result is not None:
                return result
            if cancelled is not None and cancelled():
                return None
            time.sleep(self.pause())

    def watch(self, on_done: Callable[[], object] | None = None) -> Watch:
        """This wait as the shared watcher takes it."""
        return Watch(self.token, self.consumers, self.poll_interval, on_done=on_done)

    def watched(self, db: Database, cancelled: Callable[[], bool] | None = None) -> Progress | None:
        """Wait through the process's shared watcher of ``db``
        (:mod:`messaging.waits._watcher`); None once ``cancelled()`` is true."""
        watch = self.watch()
        finished = wait_watched(db, watch, self.deadline - self.head_start(), cancelled)
        self.last = watch.last
        if finished:
            return self.outcome(watch)
        if cancelled is not None and cancelled():
            return None
        return self.final(db, cancelled)

    def outcome(self, watch: Watch) -> Progress:
        """The progress of a finished ``watch``, or its error raised."""
        if watch.error is not None:
            raise watch.error
        assert watch.result is not None
        return watch.result

    def final(self, db: Database, cancelled: Callable[[], bool] | None = None) -> Progress:
        """The check at the deadline, started :meth:`head_start` before it so that it ends
        by the deadline: the progress if applied, else :class:`WaitTimeout` naming what
        is behind, raised at the deadline, never before it (a check that ended early waits
        for the rest through the watcher: applied meanwhile still answers). A check that
        has not ended :data:`FINAL_GRACE` after the deadline (a loaded machine or
        database) is left to end on its own: the timeout names what the last check of the
        watcher found behind."""
        started = time.monotonic()
        deadline, self.deadline = self.deadline, min(self.deadline, started)
        ended = threading.Event()
        outcome: list[Progress | BaseException] = []

        def check() -> None:
            try:
                outcome.append(self.check(db))  # type: ignore[arg-type]  # past the deadline: answers or raises
            except BaseException as exc:
                outcome.append(exc)
            finally:
                _record_take(time.monotonic() - started)
                ended.set()

        threading.Thread(target=check, name="wait-final-check", daemon=True).start()
        if not ended.wait(max(0.0, deadline + FINAL_GRACE - time.monotonic())):
            raise WaitTimeout(time.monotonic() - self.started, self._last_behind())
        result = outcome[0]
        if isinstance(result, WaitTimeout):
            if time.monotonic() < deadline:
                watch = self.watch()
                if wait_watched(db, watch, deadline, cancelled):
                    return self.outcome(watch)
            waited = time.monotonic() - self.started
            raise WaitTimeout(waited, result.behind) from result.__cause__
        if isinstance(result, BaseException):
            raise result
        return result

    def _last_behind(self) -> Sequence[object]:
        """What the watcher's last check of this wait found behind (without lags), or the
        token's positions when it made none."""
        if self.last is not None and self.last.behind:
            return self.last.behind
        positions = ", ".join(map(str, sorted(self.token.positions)))
        return [
            f"the database did not answer in time (the check of what is behind did not end "
            f"within {FINAL_GRACE * 1000:.0f} ms of the deadline): position(s) {positions} "
            "not known to be applied"
        ]

    @staticmethod
    def head_start() -> float:
        """How long before the deadline the final check starts: half as much again as the
        slowest recent one took (every wait of the process), at most
        :data:`MAX_HEAD_START`."""
        return min(1.5 * _FINAL_TAKES[0], MAX_HEAD_START)

    def read(self, db: Database, detail: bool) -> Progress:
        """One check of the database (``detail``: with lags and owners)."""
        with db.read() as conn:
            return progress(db, conn, self.token, self.consumers, detail=detail)

    def pause(self) -> float:
        """Seconds to wait before the next check (never past the deadline)."""
        pause, self._pause = self._pause, min(self._pause * 2, self.poll_interval)
        return max(0.0, min(pause, self.deadline - time.monotonic()))


def _database(target: Database | Settings) -> tuple[Database, bool]:
    """The database of ``target`` and whether the wait made it (and disposes of it)."""
    if isinstance(target, Database):
        return target, False
    if isinstance(target, Settings):
        return database_for(target), True
    raise TypeError(f"expected a Database or Settings, got {type(target).__name__}")


class _CopyWaiter(Waiter):
    """A wait on an instance's copy of an in-memory consumer (:func:`wait_for_copy`)."""

    copy: Copy

    def read(self, db: Database, detail: bool) -> Progress:
        copy = self.copy
        with db.read() as conn:
            return copy_progress(
                db,
                conn,
                self.token,
                copy.spec.name,
                topics=copy.spec.topics,
                types=copy.dispatcher.type_names,
                position=copy.position,
                state=str(copy.state),
            )
