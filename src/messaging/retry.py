"""Transient database errors and the capped exponential backoff that retries them."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from messaging.errors import ConcurrentUpdate
from messaging.settings import ConflictRetrySettings

if TYPE_CHECKING:
    import pluggy

T = TypeVar("T")
log = logging.getLogger("messaging.retry")

_MYSQL_LOCKS = {1205: "lock-wait-timeout", 1213: "deadlock"}
_MYSQL_TRANSIENT = {
    *_MYSQL_LOCKS,
    2006,  # server has gone away
    2013,  # lost connection during query
    1040,  # too many connections
}
_SQLITE_LOCKS = {
    "database is locked": "busy",
    "database is busy": "busy",
    "database table is locked": "locked",
}
_FIRST_DELAY = 0.01


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same transaction may succeed: lock conflicts, lost connections and
    optimistic-concurrency conflicts (:class:`ConcurrentUpdate`)."""
    if isinstance(exc, ConcurrentUpdate):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError):
        return False
    orig = exc.orig
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0] in _MYSQL_TRANSIENT
    return lock_conflict(exc) is not None


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
    hooks: pluggy.HookRelay, instance_id: str, what: str, error: BaseException
) -> None:
    """Tell the plugins that ``what`` on ``instance_id`` retries after ``error``: always
    ``projections_retrying``, and ``projections_lock_contention`` for a lock conflict."""
    hooks.projections_retrying(what=what, instance_id=instance_id, error=error)
    kind = lock_conflict(error)
    if kind is not None:
        hooks.projections_lock_contention(what=what, instance_id=instance_id, kind=kind)


def backoff_delays(settings: ConflictRetrySettings) -> list[float]:
    """The waits before each retry: doubling from 10 ms, capped at ``max-delay``, with jitter."""
    return [
        min(settings.max_delay, _FIRST_DELAY * 2**attempt) * random.uniform(0.5, 1.0)
        for attempt in range(settings.max_retries)
    ]


def retry_transient(
    action: Callable[[], T],
    settings: ConflictRetrySettings,
    *,
    what: str,
    sleep: Callable[[float], object] = time.sleep,
    on_retry: Callable[[BaseException], object] | None = None,
) -> T:
    """Run ``action``; on a transient error retry it per ``conflict-retry``, then re-raise."""
    attempt = 0
    while True:
        try:
            return action()
        except Exception as exc:
            if attempt >= settings.max_retries or not is_transient(exc):
                raise
            delay = backoff_delays(settings)[attempt]
            attempt += 1
            log.debug("transient error in %s, retrying in %.3fs: %s", what, delay, exc)
            if on_retry is not None:
                on_retry(exc)
            sleep(delay)
