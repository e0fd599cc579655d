"""Transient database errors and the capped exponential backoff that retries them."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from messaging.errors import ConcurrentUpdate
from messaging.settings import ConflictRetrySettings

T = TypeVar("T")
log = logging.getLogger("messaging.retry")

_MYSQL_TRANSIENT = {
    1205,  # lock wait timeout
    1213,  # deadlock
    2006,  # server has gone away
    2013,  # lost connection during query
    1040,  # too many connections
}
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")
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
    text = str(orig).lower()
    return any(fragment in text for fragment in _SQLITE_TRANSIENT)


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
