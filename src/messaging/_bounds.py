"""How long an instance's database waits may last, derived from ``stale-instance-timeout``:
a lock wait gives up well before the instance could be taken for stale, and a server
that does not answer is taken for dead soon after."""

from __future__ import annotations

LOCK_WAIT_FRACTION = 4
"""An instance's lock waits give up after stale-instance-timeout / this (at least 1 s)."""


def lock_wait_bound(stale_instance_timeout: float) -> float:
    """Seconds an instance's transaction waits for a row lock (MySQL) or the write lock
    (SQLite) before failing, well below ``stale-instance-timeout``: a frozen holder cannot
    hold its waiters longer, and the wait is retried (and logged) like any lock conflict."""
    return max(1.0, stale_instance_timeout / LOCK_WAIT_FRACTION)


def answer_bound(stale_instance_timeout: float) -> float:
    """Seconds an instance waits for a MySQL/MariaDB server to answer (to connect, to take
    or send a packet) before it takes the connection for dead (see
    :mod:`messaging.store._answers`): twice the lock-wait bound, so that the server ends a
    statement waiting for a lock first; 15 s at the defaults."""
    return 2 * lock_wait_bound(stale_instance_timeout)
