"""A projection that fails on chosen item names, with parking on, and helpers to drive
its worker directly (tests/integration/test_parking.py, test_parked_ops.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from clusters import consumer_worker
from poison_item import Item
from sqlalchemy import BigInteger, Column, MetaData, String, Table, insert, select, update

from messaging import ConflictRetrySettings, Database, HandlerContext, MessageStore, handler
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Claim, Ownership
from messaging.store._retry import for_command, retry_transient
from messaging.store._rows import partition_of
from projections import projection

ME = "me-4f3c"
BROKEN: set[str] = set()
"""Item names the handler fails on (a test "fixes" the handler by emptying it)."""


def same_partition(count: int, partition: int = 0) -> list[str]:
    return [f"s{n}" for n in range(1000) if partition_of(f"s{n}", 2) == partition][:count]


@contextmanager
def items_table(db: Database) -> Iterator[Table]:
    """The read model of ``parked-items``, created, the handler failing on ``poison``
    items; dropped (and the handler restored) at the end."""
    table = make_table(db)
    with db.transaction() as conn:
        table.create(conn)
    BROKEN.clear()
    BROKEN.add("poison")
    try:
        yield table
    finally:
        BROKEN.clear()
        with db.transaction() as conn:
            table.drop(conn)


def make_table(db: Database) -> Table:
    return Table(
        f"{db.schema.prefix}parked_items",
        MetaData(),
        Column("position", BigInteger, primary_key=True, autoincrement=False),
        Column("source", String(50), nullable=False),
        Column("name", String(50), nullable=False),
    )


def parking_worker(
    db: Database,
    table: Table,
    max_sources: int | None = 10,
    *,
    first: bool = True,
    via: Database | None = None,
) -> ConsumerWorker:
    """The worker of projection ``parked-items`` (2 partitions) holding both partitions;
    ``max_sources`` None: without parking (it halts); ``via``: the database it talks
    through (a proxy), ``db`` by default."""

    @projection("parked-items", topics="items", partitions=2, tables=[table])
    class Items:
        @handler
        def item(self, event: Item, ctx: HandlerContext) -> None:
            if event.name.split("-")[0] in BROKEN:
                raise ValueError(f"cannot handle {event.name}")
            row = {"position": ctx.envelope.position, "source": ctx.envelope.source}
            ctx.execute(insert(table), {**row, "name": event.name})

    worker: ConsumerWorker = consumer_worker(
        via or db, Items, instance_id=ME, instance_name="me", max_parked=max_sources
    )
    return claimed(db, worker, first=first)


def claimed(db: Database, worker: ConsumerWorker, *, first: bool = True) -> ConsumerWorker:
    """``worker`` (of a consumer with 2 partitions) declared, holding both partitions
    (``first`` False: claiming them again)."""
    spec = worker.spec
    if not first:  # another worker of the same instance: claims again (a handover)
        reclaim(db, worker)
        return worker
    with db.transaction() as conn:
        instances = db.schema.instances
        if conn.execute(select(instances.c.id).where(instances.c.id == ME)).first() is None:
            me = InstanceInfo(id=ME, name="me", host="h", pid=1, runs={spec.name: {}})
            Membership(db).register(conn, me)  # (its code declares the consumer)
        conn.execute(
            insert(db.schema.consumers).values(
                tenant=db.tenant,
                name=spec.name,
                kind=spec.kind.value,
                distribution="partitioned",
                partitions=2,
                topics=json.dumps(list(spec.topics)),
                types=json.dumps(spec.type_names()),
                fingerprint="f",
                state="running",
                updated_at=0.0,
            )
        )
        Ownership(db).ensure_partitions(conn, spec.name, 2)
        claims = Ownership(db).claim(conn, spec.name, [0, 1], ME, Membership(db).live_ids(30))
    worker.add_claims(claims)
    return worker


def append(db: Database, *items: tuple[str, str]) -> dict[str, int]:
    """Append (source, name) pairs in this order; return each name's position."""
    store, positions = MessageStore(db), {}
    with db.transaction() as conn:
        for source, name in items:
            [positions[name]] = store.append(conn, "items", source, [Item(name)])
    return positions


def drain(worker: ConsumerWorker) -> None:
    while worker.poll():
        pass


def applied(db: Database, table: Table) -> list[tuple[str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(table.c.source, table.c.name).order_by(table.c.position))
        return [(r.source, r.name) for r in rows]


def parked(db: Database, consumer: str = "parked-items") -> dict[str, tuple[int, str, str]]:
    t = db.schema.parked
    with db.read() as conn:
        return {
            r.source: (r.position, r.state, r.error)
            for r in conn.execute(select(t).where(t.c.consumer == consumer))
        }


def partition(db: Database, partition: int) -> tuple[str, int]:
    with db.read() as conn:
        [row] = [
            r for r in Ownership(db).partitions(conn, ["parked-items"]) if r.partition == partition
        ]
    return row.status, row.checkpoint


def reclaim(db: Database, worker: ConsumerWorker) -> None:
    """What an operator's command does to the partitions (a new epoch), then the claim,
    retried as a coordinator's is (on Galera a write replicated from another node, such as
    an operator's retry, aborts it with 1213)."""
    name = worker.spec.name

    def attempt() -> list[Claim]:
        with db.transaction() as conn:
            t = db.schema.partitions
            conn.execute(update(t).where(t.c.consumer == name).values(owner=None))
            return Ownership(db).claim(conn, name, [0, 1], ME, Membership(db).live_ids(30))

    claims = retry_transient(attempt, for_command(ConflictRetrySettings()), what="reclaim")
    worker.drop([0, 1])
    worker.add_claims(claims)
