"""A cheap look, once per instance, at whether a rebalance round is worth running now.

One query reads what changes when work has to move: the consumers' states (an operator
paused, resumed or asked for a rebuild), how many of their partitions nobody owns (a
release, a rebuild handing partitions out, a fence), and who is registered or stopping.
The fence still decides who may commit; the pulse only decides when to look.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, func, select

from messaging.store.database import Database

__all__ = ["PULSE_INTERVAL", "Pulse", "read_pulse"]

PULSE_INTERVAL = 0.5
"""Seconds between two looks (at most; never more often than the rebalance interval)."""

Pulse = tuple[object, ...]
"""What the look found; two equal pulses mean nothing worth a round changed."""


def read_pulse(db: Database, conn: Connection, consumers: Sequence[str]) -> Pulse:
    """The consumers' last state change, their unowned partitions, and the registered and
    stopping instances of the tenant, in one statement."""
    c, p, i = db.schema.consumers, db.schema.partitions, db.schema.instances
    names = list(consumers)
    row = conn.execute(
        select(
            select(func.max(c.c.updated_at))
            .where(c.c.tenant == db.tenant, c.c.name.in_(names))
            .scalar_subquery(),
            select(func.count())
            .where(p.c.tenant == db.tenant, p.c.consumer.in_(names), p.c.owner.is_(None))
            .scalar_subquery(),
            select(func.count()).where(i.c.tenant == db.tenant).scalar_subquery(),
            select(func.max(i.c.started_at)).where(i.c.tenant == db.tenant).scalar_subquery(),
            select(func.count())
            .where(i.c.tenant == db.tenant, i.c.stopping.is_(True))
            .scalar_subquery(),
        )
    ).one()
    return tuple(row)
