"""Transient database errors and the capped exponential backoff that retries them.

Among transient errors, those of **unknown outcome** (:func:`is_ambiguous`: the connection
was lost during or right after a statement, possibly the COMMIT) need more than a retry:
the transaction may have committed. A retry then first re-reads whatever the retried
transaction assumes (``reread``), and every write the framework retries is conditional
on the state it was computed from, so one that already committed matches nothing.

A one-shot command (:func:`retry_command`) also has a time budget: an attempt that waited
for the database may have waited a whole answer bound, so those are retried only for
:data:`COMMAND_PATIENCE` answer bounds.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from messaging._errors import ConcurrentUpdate, Unanswered
from messaging._settings import ConflictRetrySettings
from messaging.store._nodes import NOT_PRIMARY

if TYPE_CHECKING:
    import pluggy

T = TypeVar("T")


class Answering(Protocol):
    """A database as a one-shot command's retries see it: how long it may take to answer
    (None: no bound), and its URL without the password (a
    :class:`~messaging.store._database.Database`)."""

    @property
    def answer_timeout(self) -> float | None: ...

    @property
    def safe_url(self) -> str: ...


log = logging.getLogger("messaging.store.retry")

_MYSQL_LOCKS = {
    1205: "lock-wait-timeout",
    1213: "deadlock",
    # SAVEPOINT does not exist: the server rolled the whole transaction back while a
    # savepoint was open (a deadlock, or Galera aborting it for a replicated write), and
    # the rollback to the savepoint that followed found it gone; 1213 is behind it.
    1305: "deadlock",
}
_MYSQL_LOST = {
    2006,  # server has gone away
    2013,  # lost connection during query
    0,  # PyMySQL: the connection was already closed
    1927,  # MariaDB: the connection was killed (by the instance taking over from this one)
    *NOT_PRIMARY,  # Galera: the node left the primary component (a COMMIT's fate is its)
}
_MYSQL_TRANSIENT = {
    *_MYSQL_LOCKS,
    *_MYSQL_LOST,
    1040,  # too many connections
}
_SQLITE_LOCKS = {
    "database is locked": "busy",
    "database is busy": "busy",
    "database table is locked": "locked",
}
_FIRST_DELAY = 0.01
COMMAND_RETRIES = 50
"""The least retries of a one-shot command's transaction (``projections append``, operator
commands): no graceful-shutdown-timeout bounds them as it bounds an instance's, and on a
Galera cluster concurrent writers through other nodes meet as certification conflicts
(1213 at COMMIT), which a few short retries may not outlast."""


COMMAND_PATIENCE = 2
"""A one-shot command retries an attempt that waited for the database until this many answer
bounds have passed since its first attempt: a whole wait, and a retry (on the next node of
a failover list) that may wait as long."""


def for_command(settings: ConflictRetrySettings) -> ConflictRetrySettings:
    """``settings`` with at least :data:`COMMAND_RETRIES` retries."""
    return attrs.evolve(settings, max_retries=max(settings.max_retries, COMMAND_RETRIES))


def retry_command(
    action: Callable[[], T],
    db: Answering,
    settings: ConflictRetrySettings,
    *,
    what: str,
    reread: Callable[[BaseException], object] | None = None,
    on_retry: Callable[[BaseException], object] | None = None,
    reads_only: bool = False,
) -> T:
    """Run a one-shot command's transaction (``projections append``, an operator command,
    :meth:`~messaging.store._database.Database.prepare`) under :func:`retry_transient`
    per ``settings`` (:func:`for_command` for a command that meets certification conflicts),
    except that an attempt that ended a wait (:func:`ended_a_wait`) is retried only until
    :data:`COMMAND_PATIENCE` answer bounds of ``db`` have passed since the first attempt
    (for ever without a bound); deadlocks and certification conflicts, quick, keep their
    count. Giving up on a wait raises :class:`Unanswered` (it names the database and the
    time waited). ``reads_only``: the action writes nothing a user asked for (a report's
    reads, the idempotent set-up of :meth:`~messaging.store._database.Database.prepare`):
    one answer bound is its budget, and giving up says the database did not answer (no
    outcome to be unsure of)."""
    patience = 1 if reads_only else COMMAND_PATIENCE
    started = time.monotonic()
    attempts = 0
    unknown = False

    def attempt() -> T:
        nonlocal attempts
        attempts += 1
        return action()

    def impatient(exc: BaseException) -> bool:
        bound = db.answer_timeout
        spent = time.monotonic() - started
        return bound is not None and ended_a_wait(exc) and spent >= patience * bound

    def retrying(exc: BaseException) -> None:
        nonlocal unknown
        unknown = unknown or is_ambiguous(exc)
        if on_retry is not None:
            on_retry(exc)

    try:
        return retry_transient(
            attempt,
            settings,
            what=what,
            on_retry=retrying,
            reread=reread,
            give_up=impatient,
        )
    except Exception as exc:
        if db.answer_timeout is None or not ended_a_wait(exc):
            raise
        raise Unanswered(
            what,
            db.safe_url,
            time.monotonic() - started,
            attempts,
            exc,
            outcome_unknown=not reads_only and (unknown or is_ambiguous(exc)),
            reads_only=reads_only,
        ) from exc


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same transaction may succeed: lock conflicts, lost connections and
    optimistic-concurrency conflicts (:class:`ConcurrentUpdate`)."""
    if isinstance(exc, ConcurrentUpdate) or is_ambiguous(exc):
        return True
    if not isinstance(exc, OperationalError):
        return False
    orig = exc.orig
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0] in _MYSQL_TRANSIENT
    return lock_conflict(exc) is not None


def is_ambiguous(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the outcome of its transaction unknown: the connection was lost
    (MySQL 2006, 2013; PyMySQL's 0 for a closed connection; anything SQLAlchemy invalidated
    the connection for), or its Galera node left the primary component (1047, 1180). Its
    COMMIT may have gone through. (SQLite never raises these: its commit returns
    in-process.)"""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        code = next(iter(getattr(exc.orig, "args", ())), None)
        return isinstance(code, int) and code in _MYSQL_LOST
    return False


def ended_a_wait(exc: BaseException) -> bool:
    """Whether ``exc`` ends a wait for the database, which may have lasted a whole answer
    bound: a lost or unanswered connection (:func:`is_ambiguous`), a lock wait that ran out
    (MySQL 1205, SQLite busy)."""
    return is_ambiguous(exc) or lock_conflict(exc) in ("lock-wait-timeout", "busy")


def lock_conflict(exc: BaseException) -> str | None:
    """Which lock conflict ``exc`` is, if it is one: ``"lock-wait-timeout"`` or
    ``"deadlock"`` (MySQL), ``"busy"`` or ``"locked"`` (SQLite); None for anything else."""
    if not isinstance(exc, OperationalError):
        return None
    args = getattr(exc.orig, "args", ())
    if args and isinstance(args[0], int):
        return _MYSQL_LOCKS.get(args[0])
    text = str(exc.orig).lower()
    return next((kind for fragment, kind in _SQLITE_LOCKS.items() if fragment in text), None)


def report_retry(
    hooks: pluggy.HookRelay,
    instance_id: str,
    what: str,
    error: BaseException,
) -> None:
    """Tell the plugins that ``what`` on ``instance_id`` retries after ``error``: always
    ``projections_retrying``, and ``projections_lock_contention`` for a lock conflict."""
    hooks.projections_retrying(what=what, instance_id=instance_id, error=error)
    kind = lock_conflict(error)
    if kind is not None:
        hooks.projections_lock_contention(what=what, instance_id=instance_id, kind=kind)


def report_batch_retry(
    hooks: pluggy.HookRelay,
    instance_id: str,
    what: str,
    partitions: Iterable[int],
    error: BaseException,
) -> None:
    """:func:`report_retry` for a batch of ``partitions``; a lock wait that ran out is
    logged at WARNING: a transaction holds rows the batch needs (a slow batch, or an
    instance frozen inside its transaction)."""
    report_retry(hooks, instance_id, what, error)
    if lock_conflict(error) in ("lock-wait-timeout", "busy"):
        log.warning(
            "%s: partitions %s gave up waiting for a lock another transaction holds "
            "(a slow or frozen instance?); retrying: %s",
            what,
            sorted(partitions),
            getattr(error, "orig", error),
        )


_MYSQL_UNREACHABLE = {
    1040,  # too many connections
    1053,  # server shutdown in progress
    1927,  # connection was killed
    2002,  # can't connect through the socket
    2003,  # can't connect to the server
    2006,  # server has gone away
    2013,  # lost connection during query
    2055,  # lost connection at some stage
    *NOT_PRIMARY,  # a Galera node out of the primary component
}
_SQLITE_UNREACHABLE = ("unable to open database file", "disk i/o error")


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached (rather than that a statement
    or a handler is wrong): a refused or lost connection, a server shutting down, a
    SQLite file that cannot be opened."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    args = getattr(exc.orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0] in _MYSQL_UNREACHABLE
    text = str(exc.orig).lower()
    return isinstance(exc, InterfaceError) or any(f in text for f in _SQLITE_UNREACHABLE)


def backoff_delay(settings: ConflictRetrySettings, attempt: int) -> float:
    """The wait before retry ``attempt`` (from 0): doubling from 10 ms, capped at
    ``max-delay``, with jitter."""
    doubled: float = _FIRST_DELAY * 2 ** min(attempt, 32)
    return min(settings.max_delay, doubled) * random.uniform(0.5, 1.0)


class _Storm:
    """The level of a line that may come from every loop at once (a lost network loses
    every connection): WARNING, then INFO for the others within :attr:`window` seconds."""

    window = 5.0

    def __init__(self) -> None:
        self._last = -self.window
        self._lock = threading.Lock()

    def level(self) -> int:
        with self._lock:
            now = time.monotonic()
            quiet = now - self._last < self.window
            if not quiet:
                self._last = now
        return logging.INFO if quiet else logging.WARNING


_LOST = _Storm()


def retry_transient(
    action: Callable[[], T],
    settings: ConflictRetrySettings,
    *,
    what: str,
    sleep: Callable[[float], object] = time.sleep,
    on_retry: Callable[[BaseException], object] | None = None,
    reread: Callable[[BaseException], object] | None = None,
    give_up: Callable[[BaseException], bool] | None = None,
) -> T:
    """Run ``action``; on a transient error retry it per ``conflict-retry`` (unless
    ``give_up`` says otherwise for that error), then re-raise.

    After an error of unknown outcome (:func:`is_ambiguous`, logged at WARNING) ``reread``
    runs before the retry: it re-reads from the database what ``action`` assumes, and
    raises to give the retry up when the first attempt turns out to have committed."""
    attempt = 0
    while True:
        try:
            return action()
        except Exception as exc:
            if attempt >= settings.max_retries or not is_transient(exc):
                raise
            if give_up is not None and give_up(exc):
                raise
            delay = backoff_delay(settings, attempt)
            attempt += 1
            if is_ambiguous(exc):
                log.log(  # the driver's error alone: one line, no SQL or parameters
                    _LOST.level(),
                    "%s: connection lost, outcome unknown; re-reading, retrying in %.3fs: %s",
                    what,
                    delay,
                    getattr(exc, "orig", None) or exc,
                )
            else:
                log.debug("transient error in %s, retrying in %.3fs: %s", what, delay, exc)
            if on_retry is not None:
                on_retry(exc)
            sleep(delay)
            if reread is not None and is_ambiguous(exc):
                reread(exc)
