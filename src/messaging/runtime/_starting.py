"""How an instance's start retries its steps: patient with locks, brief with the rest.

Every join (a registration, a declaration, a claim) updates the tenant's generation row,
so instances started at once queue on it (on SQLite, on the write lock): 64 of them on a
loaded machine waited out their lock-wait bound more often than ``conflict-retry``
allows, and exited. A start step that meets a lock conflict therefore retries, with
``conflict-retry``'s backoff, until :data:`START_PATIENCE` stale-instance-timeouts (at
least :data:`MIN_START_PATIENCE` seconds) have passed since its first attempt, however
many retries that takes, and says so once per start. Other transient errors (a lost
connection) keep ``conflict-retry``'s count. A stop asked for meanwhile ends the wait at
once.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import attrs

from messaging._settings import ConsumerSettings
from messaging.store._retry import lock_conflict, retry_transient

log = logging.getLogger("messaging.runtime.instance")

T = TypeVar("T")

START_PATIENCE = 4
"""Stale-instance-timeouts a start step retries lock conflicts for (2 minutes at the
defaults): time for a frozen holder's connection to be ended by the instance taking over
from it, and for a crowd of joiners to pass the generation row one by one."""
MIN_START_PATIENCE = 60.0
"""Seconds a start step retries lock conflicts for at least, however short the timeouts:
how long a crowd takes depends on the machine's load, not on them."""


@attrs.define
class StartRetry:
    """Runs the steps of one instance's start (see the module)."""

    instance: str
    """The instance's name, for the log."""
    settings: ConsumerSettings
    on_retry: Callable[[str, BaseException], object]
    """Told of every retry: the step, and the error."""
    interrupted: Callable[[], bool]
    """Whether a stop was asked for: the step then gives up at once."""
    _warned: bool = False

    @property
    def patience(self) -> float:
        """Seconds a step retries lock conflicts for."""
        return max(START_PATIENCE * self.settings.stale_instance_timeout, MIN_START_PATIENCE)

    def __call__(self, action: Callable[[], T], what: str) -> T:
        """Run the step ``action`` (``what``, for the log) with its retries."""
        started = time.monotonic()
        others = 0

        def give_up(exc: BaseException) -> bool:
            nonlocal others
            if self.interrupted():
                return True
            if lock_conflict(exc) is not None:
                return time.monotonic() - started >= self.patience
            others += 1
            return others > self.settings.conflict_retry.max_retries

        def retrying(exc: BaseException) -> None:
            if lock_conflict(exc) is not None and not self._warned:
                self._warned = True
                log.warning(
                    "instance %s: %s waits for a lock another transaction holds (instances "
                    "joining at once?); retrying for up to %.0f s: %s",
                    self.instance,
                    what,
                    self.patience,
                    getattr(exc, "orig", exc),
                )
            self.on_retry(what, exc)

        unbounded = attrs.evolve(
            self.settings.conflict_retry, max_retries=sys.maxsize
        )  # give_up bounds it
        return retry_transient(action, unbounded, what=what, on_retry=retrying, give_up=give_up)
