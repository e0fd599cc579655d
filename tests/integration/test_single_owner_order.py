"""A single owner applies in global position order: with all partitions, or not at all."""

from __future__ import annotations

from clusters import consumer_worker
from poison_item import Item
from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, insert, select

from messaging import (
    Database,
    HandlerContext,
    MessageStore,
    handler,
)
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from projections import projection


def test_a_single_owner_with_some_partitions_applies_nothing(db: Database) -> None:
    """Holding one of two partitions, it waits; holding both, it applies in position order."""
    table = Table(
        f"{db.schema.prefix}order_seen",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("position", BigInteger, nullable=False),
    )

    @projection("order-seen", topics="ordered", partitions=2, tables=[table])
    class Seen:
        @handler
        def item(self, event: Item, ctx: HandlerContext) -> None:
            ctx.execute(insert(table), {"position": ctx.envelope.position})

    ownership, live = Ownership(db), Membership(db).live_ids(30)
    with db.transaction() as conn:
        table.create(conn)
        Membership(db).register(conn, InstanceInfo(id="me", name="me", host="h", pid=1))
        ownership.ensure_partitions(conn, "order-seen", 2)
        store = MessageStore(db)
        for n in range(10):
            store.append(conn, "ordered", f"source-{n}", [Item(str(n))])
        first = ownership.claim(conn, "order-seen", [0], "me", live)
    worker = consumer_worker(db, Seen, instance_id="me", whole=True)
    worker.add_claims(first)
    assert worker.poll() == 0
    with db.transaction() as conn:
        worker.add_claims(ownership.claim(conn, "order-seen", [1], "me", live))
    assert worker.poll() == 10
    with db.read() as conn:
        seen = list(conn.execute(select(table.c.position).order_by(table.c.id)).scalars())
    assert seen == sorted(seen) and len(seen) == 10
