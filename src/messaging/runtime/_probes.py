"""Liveness and readiness of the instance an admin server runs beside, as load balancers
and Kubernetes probes ask (``GET /admin/health/live``, ``/admin/health/ready``).

- **Live**: every loop thread the instance started still runs, and none is past its
  watchdog bound (:meth:`~messaging.runtime._watchdog.Watchdog.overdue`). An unreachable
  database does not make an instance dead: restarting it would not bring the database
  back. A stopping instance is live (its loops end on purpose).
- **Ready**: started (its loops run), registered, not stopping, and no outage going on
  as its loops last saw the database (unreachable, or refusing writes: the reason says
  which). Without an instance (``projections admin``, a supervisor), the server is live
  while it answers and ready while a query reaches the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from messaging.store._database import Database
from messaging.store._refusals import answers

if TYPE_CHECKING:
    from messaging.runtime._instance import Instance

__all__ = ["liveness", "readiness"]

UNREACHABLE = "the database is unreachable"


def liveness(instance: Instance | None) -> list[str]:
    """Why ``instance`` is not live (empty when it is)."""
    if instance is None or instance.stop_requested.is_set():
        return []
    ended = [f"its {name} loop has ended" for name, alive in instance.loops().items() if not alive]
    stuck = [f"its {name} loop is past its bound" for name in instance.watchdog.overdue()]
    return ended + stuck


def readiness(instance: Instance | None, db: Database) -> list[str]:
    """Why ``instance`` (or, without one, this server) is not ready (empty when it is)."""
    if instance is None:
        return [] if answers(db) else [UNREACHABLE]
    reasons = []
    if not instance.loops():
        reasons.append("starting")
    if not instance.registered:
        reasons.append("not registered")
    if instance.stop_requested.is_set():
        reasons.append("stopping")
    causes = {instance.heartbeat_outage.cause, instance.outage.cause} - {None}
    return reasons + sorted(str(cause) for cause in causes)
