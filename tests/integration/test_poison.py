"""A message that cannot be handled halts its partition right before it; the partition's
earlier messages and every other partition go on, and nothing is skipped."""

from __future__ import annotations

import logging

import pytest
from clusters import consumer_worker
from poison_item import Item
from sqlalchemy import BigInteger, Column, MetaData, String, Table, insert, select

from messaging import Database, HandlerContext, MessageStore, handler
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.store._rows import partition_of
from projections import projection

ME_ID = "4f3c9a"
"""The worker's instance id; its name is ``me``."""


def _setup(db: Database) -> tuple[ConsumerWorker, Table]:
    table = Table(
        f"{db.schema.prefix}poison_items",
        MetaData(),
        Column("position", BigInteger, primary_key=True, autoincrement=False),
        Column("name", String(50), nullable=False),
    )

    @projection("poison-items", topics="items", partitions=2, tables=[table])
    class Items:
        @handler
        def item(self, event: Item, ctx: HandlerContext) -> None:
            if event.name == "poison":
                raise ValueError("cannot handle poison")
            ctx.execute(insert(table), {"position": ctx.envelope.position, "name": event.name})

    with db.transaction() as conn:
        table.create(conn)
        Membership(db).register(conn, InstanceInfo(id=ME_ID, name="me", host="h", pid=1))
        Ownership(db).ensure_partitions(conn, "poison-items", 2)
        claims = Ownership(db).claim(
            conn, "poison-items", [0, 1], ME_ID, Membership(db).live_ids(30)
        )
    worker = consumer_worker(db, Items, instance_id=ME_ID, instance_name="me")
    worker.add_claims(claims)
    return worker, table


@pytest.mark.parametrize("poisoned", [0, 1])
def test_poison_halts_its_partition_before_it_and_others_go_on(db: Database, poisoned: int) -> None:
    """The halted partition keeps its messages before the poison; the other applies all.
    Whichever partition the poison is in halts (a one-lane worker reads no partition
    hash and looks the poison's up)."""
    worker, table = _setup(db)
    source = {p: next(f"s{n}" for n in range(100) if partition_of(f"s{n}", 2) == p) for p in (0, 1)}
    names = ["a", "b", "poison", "c"]
    store = MessageStore(db)
    with db.transaction() as conn:
        for name in names:
            for p in (0, 1):
                text = name if p == poisoned else f"other-{name}"
                store.append(conn, "items", source[p], [Item(text)])
    while worker.poll():
        pass
    with db.read() as conn:
        applied = {r.name: r.position for r in conn.execute(select(table))}
        parts = {r.partition: r for r in Ownership(db).partitions(conn, ["poison-items"])}
    assert set(applied) == {"a", "b", "other-a", "other-b", "other-poison", "other-c"}
    poison_position = applied["b"] + 2  # appended after b's twin
    halted = parts[poisoned]
    assert halted.status == "halted" and halted.halted_position == poison_position
    assert halted.halted_type == "test.poison.item" and "cannot handle poison" in (
        halted.error or ""
    )
    assert halted.checkpoint == poison_position - 1  # up to the message right before it
    other = parts[1 - poisoned]
    assert other.status == "running" and other.checkpoint == applied["other-c"]


def test_a_halt_carries_its_stack_trace(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """The halt is logged once at ERROR with the handler's whole traceback (not chained to
    the framework's first, buffered attempt at the batch), and the last frames are
    kept with the halted partition, so that `status --json` shows where it failed."""
    worker, _ = _setup(db)
    with db.transaction() as conn:
        MessageStore(db).append(conn, "items", "s0", [Item("a"), Item("poison")])
    with caplog.at_level(logging.DEBUG):
        while worker.poll():
            pass
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    [record] = errors
    assert "event=halt" in record.getMessage()
    assert f"instance=me instance_id={ME_ID} " in record.getMessage()  # name, then id
    logged = logging.Formatter().format(record)
    assert "Traceback (most recent call last)" in logged
    assert logged.count('raise ValueError("cannot handle poison")') == 1  # the handler's alone
    assert "Poison" not in logged and "During handling" not in logged
    parts = db.schema.partitions
    with db.read() as conn:
        traces = (
            conn.execute(select(parts.c.halted_trace).where(parts.c.status == "halted"))
            .scalars()
            .all()
        )
    assert len(traces) == 1
    [trace] = traces
    assert trace.startswith("Traceback (most recent call last)")
    assert ", in item\n" in trace and 'raise ValueError("cannot handle poison")' in trace
    assert trace.endswith("ValueError: cannot handle poison")
