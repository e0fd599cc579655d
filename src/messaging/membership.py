"""Instances: registration, heartbeats stamped by the database clock, and who is live.

An instance is live while its heartbeat is younger than ``stale-instance-timeout``,
compared in SQL against the same clock that stamped it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
from sqlalchemy import Connection, Select, case, delete, insert, select, update

from messaging.database import Database


@attrs.define(frozen=True, kw_only=True)
class InstanceInfo:
    """What an instance says about itself in its row."""

    id: str
    name: str
    host: str
    pid: int
    runs: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    """Consumer name → {"distribution": ..., "fingerprint": ...}."""


@attrs.define(frozen=True, kw_only=True)
class InstanceRow:
    """An instance as the database records it."""

    id: str
    name: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    stopping: bool
    live: bool
    runs: Mapping[str, Mapping[str, Any]]


class Membership:
    """Reads and writes the ``instances`` table of one tenant."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.schema.instances

    def register(self, conn: Connection, info: InstanceInfo) -> None:
        """Insert this instance's row, stamped now (its first heartbeat)."""
        now = self.db.clock.now()
        conn.execute(
            insert(self.table).values(
                tenant=self.db.tenant,
                id=info.id,
                name=info.name,
                host=info.host,
                pid=info.pid,
                started_at=now,
                heartbeat_at=now,
                stopping=False,
                runs=json.dumps(info.runs, sort_keys=True),
            )
        )

    def heartbeat(self, conn: Connection, instance_id: str, *, stopping: bool = False) -> bool:
        """Stamp the heartbeat; False if the row is gone (removed as stale)."""
        t = self.table
        result = conn.execute(
            update(t)
            .where(t.c.tenant == self.db.tenant, t.c.id == instance_id)
            .values(heartbeat_at=self.db.clock.now(), stopping=stopping)
        )
        return result.rowcount == 1

    def deregister(self, conn: Connection, instance_id: str) -> None:
        """Delete this instance's row (clean stop)."""
        t = self.table
        conn.execute(delete(t).where(t.c.tenant == self.db.tenant, t.c.id == instance_id))

    def live_ids(self, stale_timeout: float) -> Select[tuple[str]]:
        """A subquery of the ids of live instances."""
        t = self.table
        return select(t.c.id).where(
            t.c.tenant == self.db.tenant,
            t.c.heartbeat_at >= self.db.clock.now() - stale_timeout,
        )

    def instances(self, conn: Connection, stale_timeout: float) -> list[InstanceRow]:
        """Every registered instance with its liveness, ordered by name then id."""
        t = self.table
        live = case((t.c.heartbeat_at >= self.db.clock.now() - stale_timeout, True), else_=False)
        rows = conn.execute(
            select(
                t.c.id,
                t.c.name,
                t.c.host,
                t.c.pid,
                t.c.started_at,
                t.c.heartbeat_at,
                t.c.stopping,
                live.label("live"),
                t.c.runs,
            )
            .where(t.c.tenant == self.db.tenant)
            .order_by(t.c.name, t.c.id)
        )
        return [
            InstanceRow(
                id=r.id,
                name=r.name,
                host=r.host,
                pid=r.pid,
                started_at=float(r.started_at),
                heartbeat_at=float(r.heartbeat_at),
                stopping=bool(r.stopping),
                live=bool(r.live),
                runs=json.loads(r.runs),
            )
            for r in rows
        ]
