"""The pulse: one cheap statement that tells an instance whether anything is worth a look.

It reads two things. The tenant's **generation**, a counter that every change of
membership or ownership bumps in its own transaction: a join or a leave, a release, a
stopping flag, an operator's pause, resume or rebuild, a rebuild handing partitions
out. A counter cannot come back to an earlier value, so two equal readings mean that
nothing of the kind committed in between (counts of rows could change and change
back). And the **head** of every topic the instance's consumers read: the highest
position stored in it, from the messages' ``(tenant, topic, position)`` index, which
costs one index seek per topic and no write on the append path (appends take the
tenant's position row anyway; positions commit in order, so a head never skips a
message).

An instance runs a rebalance round when the generation moved and lets a consumer poll
only when one of its topics' heads did. The pulse decides *when* to look, never *who may
commit*: the fenced checkpoint of :mod:`messaging.distribution._ownership` does that. A
missed or stale pulse only delays: the regular rounds still run, and a head that moved
is still higher at the next reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from messaging.store._database import Database

__all__ = ["Pulse", "bump_generation", "read_generation", "read_pulse"]


@attrs.frozen
class Pulse:
    """One reading: the tenant's generation and the head of each topic read."""

    generation: int
    heads: Mapping[str, int]
    """Topic → the highest position stored in it (0 for an empty topic)."""

    def moved(self, earlier: Pulse | None) -> frozenset[str]:
        """The topics whose head differs from ``earlier`` (all of them when there is none)."""
        if earlier is None:
            return frozenset(self.heads)
        return frozenset(t for t, head in self.heads.items() if earlier.heads.get(t) != head)


def _generation(db: Database):  # type: ignore[no-untyped-def]  # a scalar subquery
    g = db.schema.generations
    return select(g.c.generation).where(g.c.tenant == db.tenant).scalar_subquery()


def read_pulse(db: Database, conn: Connection, topics: Sequence[str]) -> Pulse:
    """The generation and the heads of ``topics``, in one statement."""
    m = db.schema.messages
    ordered = sorted(set(topics))
    heads = [
        select(func.coalesce(func.max(m.c.position), 0))
        .where(m.c.tenant == db.tenant, m.c.topic == topic)
        .scalar_subquery()
        for topic in ordered
    ]
    row = conn.execute(select(func.coalesce(_generation(db), 0), *heads)).one()
    return Pulse(
        generation=int(row[0]),
        heads={topic: int(head) for topic, head in zip(ordered, row[1:], strict=True)},
    )


def read_generation(db: Database, conn: Connection) -> int:
    """The tenant's generation alone (what a rebalance round reads before its rows)."""
    return int(conn.execute(select(func.coalesce(_generation(db), 0))).scalar_one())


def bump_generation(db: Database, conn: Connection) -> None:
    """Count one change of membership or ownership, in ``conn``'s transaction. Call it as
    the transaction's last write: the counter's row lock is then held only until the
    commit, and no transaction holding it waits for another."""
    g = db.schema.generations
    bumped = conn.execute(
        update(g).where(g.c.tenant == db.tenant).values(generation=g.c.generation + 1)
    )
    if bumped.rowcount == 0:  # a database prepared before the counter existed
        try:
            with conn.begin_nested():
                conn.execute(insert(g).values(tenant=db.tenant, generation=1))
        except IntegrityError:
            bump_generation(db, conn)  # another transaction created it first
