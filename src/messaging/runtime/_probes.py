"""Liveness and readiness of the instance an admin server runs beside, as load balancers
and Kubernetes probes ask (``GET /admin/health/live``, ``/admin/health/ready``).

- **Live**: every loop thread the instance started still runs, none is past its
  watchdog bound (:meth:`~messaging.runtime._watchdog.Watchdog.overdue`), and no batch
  is stuck past its ``apply-timeout`` by as long again, at most 10 s
  (:meth:`~messaging.applying._apply_timeout.ApplyDeadlines.stuck`: a handler that never
  returns holds its partition for good; a restart frees it); live again once it
  returns. An unreachable database does not make an instance dead: restarting it would
  not bring the database back. A stopping instance is live (its loops end on purpose).
- **Ready**: started (its loops run), registered, not stopping, no outage going on as
  its loops last saw the database (unreachable, or refusing writes: the reason says
  which), and no heartbeat left unanswered past the lock-wait bound (a database that
  went silent, before its connections time out: within the answer bound). Without an
  instance (``projections admin``, a supervisor), the server is live while it answers
  and ready while its database check (:class:`~messaging.runtime._probes.DatabaseCheck`)
  finds the database answering.

Both answer from memory, at once, whatever the database does.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from messaging.runtime._refreshed import Refreshed
from messaging.store._database import Database
from messaging.store._refusals import answers

if TYPE_CHECKING:
    from messaging.runtime._instance import Instance

__all__ = ["DatabaseCheck", "liveness", "readiness"]

UNREACHABLE = "the database is unreachable"


def liveness(instance: Instance | None) -> list[str]:
    """Why ``instance`` is not live (empty when it is)."""
    if instance is None or instance.stop_requested.is_set():
        return []
    ended = [f"its {name} loop has ended" for name, alive in instance.loops().items() if not alive]
    stuck = [f"its {name} loop is past its bound" for name in instance.watchdog.overdue()]
    return ended + stuck + instance.watchdog.applies.stuck()


class DatabaseCheck:
    """Whether the database answers, for a server without an instance: checked by a thread
    of its own every second while probes come (:class:`Refreshed`), so that a probe never
    waits on it. A check that has waited past ``silent_after`` seconds is a database that
    stopped answering."""

    def __init__(self, db: Database, silent_after: float) -> None:
        self.silent_after = silent_after
        self._check = Refreshed(partial(answers, db), name="database-check")

    def reasons(self) -> list[str]:
        """Why the database does not look ready now (empty when it does)."""
        reading = self._check.get()
        if reading.waiting > self.silent_after:
            return [f"the database has not answered for {reading.waiting:.1f} s"]
        if reading.value is None:
            return ["the database has not answered yet"]
        return [] if reading.value else [UNREACHABLE]


def readiness(instance: Instance | None, check: DatabaseCheck) -> list[str]:
    """Why ``instance`` (or, without one, this server: ``check``) is not ready (empty when
    it is): among the reasons, a consumer its code declares that it has applied nothing of
    for longer than ``health.stall-timeout``, because the database holds another
    declaration of it."""
    if instance is None:
        return check.reasons()
    reasons = []
    if not instance.loops():
        reasons.append("starting")
    if not instance.registered:
        reasons.append("not registered")
    if instance.stop_requested.is_set():
        reasons.append("stopping")
    causes = {instance.heartbeat_outage.cause, instance.outage.cause} - {None}
    silent = instance.presence.silence()
    if silent is not None:
        reasons.append(f"the database has not answered a heartbeat for {silent:.1f} s")
    grace = instance.declared.settings.health.stall_timeout
    for name, seconds in sorted(instance.presence.stale_for().items()):
        if seconds > grace:  # (within it: a rolling deploy's old instance, about to go)
            reasons.append(
                f"applies nothing of {name} for {seconds:.0f} s: the database holds another "
                f"declaration of it (deploy the current code, or `projections rollback {name}`)"
            )
    return reasons + sorted(str(cause) for cause in causes)
