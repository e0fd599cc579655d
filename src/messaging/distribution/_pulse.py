"""The pulse: one cheap statement that tells an instance whether anything is worth a look.

It reads two things. The tenant's **generation**, a counter that every change of
membership or ownership bumps in its own transaction: a join or a leave, a release, a
stopping flag, an operator's pause, resume or rebuild, a rebuild handing partitions
out. A counter cannot come back to an earlier value, so two equal readings mean that
nothing of the kind committed in between (counts of rows could change and change
back). It counts two kinds of change in one ``BIGINT``: a partition released by a live
instance handing it to the instance its peers planned it for adds :data:`RELEASE`
(2³²), any other change :data:`CHANGE` (1, as every change did before releases were
told apart, so that instances of both versions read each other right). A release
changes no instance's plan, it only lets the instance waiting for that partition claim
it: when only releases moved the counter (:func:`only_releases`), an instance that
waits for no partition of a live peer has nothing to do, and 64 instances do not all
run a round for each release of a join. (Four billion other changes carry into the
upper half, which still reads as a change.)
And the **head** of every topic the instance's consumers read: the highest
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
from sqlalchemy import Connection, Select, Table, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from messaging.store import _fastpath
from messaging.store._built import per_table
from messaging.store._database import Database

__all__ = [
    "CHANGE",
    "RELEASE",
    "Pulse",
    "PulseReader",
    "bump_generation",
    "only_releases",
    "read_generation",
]

CHANGE = 1
"""What a change of membership or ownership adds to the generation (its lower 32 bits
count them), but a release."""
RELEASE = 1 << 32
"""What a release adds (the upper bits count releases)."""


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


class PulseReader:
    """Reads the pulse of one database and set of topics: one statement, built once and
    sent straight to the driver once learnt (an idle instance beats several times a
    second, a busy appender's host after every commit)."""

    def __init__(self, db: Database, topics: Sequence[str]) -> None:
        self.db = db
        self.topics = sorted(set(topics))
        m = db.schema.messages
        heads = [
            select(func.coalesce(func.max(m.c.position), 0))
            .where(m.c.tenant == bindparam("t"), m.c.topic == bindparam(f"topic{i}"))
            .scalar_subquery()
            for i in range(len(self.topics))
        ]
        g = db.schema.generations
        generation = select(g.c.generation).where(g.c.tenant == bindparam("t"))
        self._statement = select(func.coalesce(generation.scalar_subquery(), 0), *heads)
        self._params = {"t": db.tenant, **{f"topic{i}": t for i, t in enumerate(self.topics)}}

    def read(self, conn: Connection) -> Pulse:
        """The generation and the heads of the topics, in one statement."""
        direct = _fastpath.sends_directly(conn)
        (row,) = _fastpath.fetch(conn, self._statement, self._params, direct=direct)
        return Pulse(
            generation=int(row[0]),
            heads={topic: int(head) for topic, head in zip(self.topics, row[1:], strict=True)},
        )


def read_generation(db: Database, conn: Connection) -> int:
    """The tenant's generation alone (what a rebalance round reads before its rows)."""
    query = _generation_query(db.schema.generations)
    rows = _fastpath.fetch(conn, query, {"t": db.tenant}, direct=_fastpath.sends_directly(conn))
    return int(rows[0][0])


@per_table
def _generation_query(g: Table) -> Select[tuple[int]]:
    """The query of :func:`read_generation` on the counters ``g``, built once (the tenant is
    its parameter ``t``)."""
    generation = select(g.c.generation).where(g.c.tenant == bindparam("t")).scalar_subquery()
    return select(func.coalesce(generation, 0))


def bump_generation(db: Database, conn: Connection, *, release: bool = False) -> None:
    """Count one change of membership or ownership (``release``: a live instance's release
    of partitions its peers plan elsewhere, nothing else), in ``conn``'s transaction. Call
    it as the transaction's last write: the counter's row lock is then held only until
    the commit, and no transaction holding it waits for another."""
    g = db.schema.generations
    step = RELEASE if release else CHANGE
    bumped = conn.execute(
        update(g).where(g.c.tenant == db.tenant).values(generation=g.c.generation + step)
    )
    if bumped.rowcount == 0:  # a database prepared before the counter existed
        try:
            with conn.begin_nested():
                conn.execute(insert(g).values(tenant=db.tenant, generation=step))
        except IntegrityError:
            bump_generation(db, conn, release=release)  # another transaction created it first


def only_releases(earlier: int | None, now: int) -> bool:
    """Whether nothing but releases moved the generation from ``earlier`` to ``now``."""
    return earlier is not None and earlier % RELEASE == now % RELEASE
