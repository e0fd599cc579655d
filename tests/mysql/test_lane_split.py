"""A partition is not held behind another partition's backlog while a lane is free: the
lanes of a read are made of whole partitions at each read, so two partitions with
messages go to two lanes and are applied at the same time. Lanes used to be fixed as
``p % lanes``: partitions 0 and 4 of a 4-lane consumer shared a lane, and 4's messages
waited behind 0's backlog with three lanes idle (16 instances owning 8 of 128 partitions
each left some lanes with none and others with three)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import attrs
import pytest
from clusters import wait_until
from sqlalchemy import BigInteger, Column, MetaData, String, Table, insert, select

from messaging import (
    Database,
    HandlerContext,
    Instance,
    MessageStore,
    collect_consumers,
    create_plugin_manager,
    handler,
    hookimpl,
    message,
)
from messaging._config import settings_from_mapping
from messaging.store._rows import partition_of
from projections import projection

pytestmark = pytest.mark.mysql

PARTITIONS = 8
LANES = 4
BACKLOG = 30
metadata = MetaData()
applied = Table(
    "lane_split_applied",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("source", String(20), nullable=False),
)
meeting = threading.Barrier(2)
"""The first message of each of the two partitions waits here for the other's."""


@message("test.lane_split.item")
@attrs.define(frozen=True)
class Item:
    n: int


@projection("lane-split", topics="split", partitions=PARTITIONS, tables=[applied])
class LaneSplit:
    @handler
    def item(self, event: Item, ctx: HandlerContext) -> None:
        if event.n == 0:
            meeting.wait(timeout=30)  # broken (and the partition halted) unless concurrent
        ctx.execute(
            insert(applied), {"position": ctx.envelope.position, "source": ctx.envelope.source}
        )


def _source(partition: int) -> str:
    return next(f"s{n}" for n in range(1000) if partition_of(f"s{n}", PARTITIONS) == partition)


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [metadata]


@pytest.fixture
def instance(db: Database) -> Iterator[Instance]:
    class Contribute:
        @hookimpl
        def projections_consumers(self) -> list[type]:
            return [LaneSplit]

    consumer = {"batch-size": 10, "idle-poll-interval": "20ms", "executor": {"max-workers": LANES}}
    settings = settings_from_mapping({"messaging": {"consumer": consumer}})
    manager = create_plugin_manager([], plugins=[Contribute()], load_entrypoints=False)
    running = Instance(db, collect_consumers(manager), settings, manager.hook, name="split")
    meeting.reset()
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_a_partition_is_not_held_behind_the_backlog_of_its_old_lane_mate(
    db: Database, instance: Instance
) -> None:
    backlog, late = _source(0), _source(4)  # one lane as p % 4
    store = MessageStore(db)
    with db.transaction() as conn:
        for n in range(BACKLOG):
            store.append(conn, "split", backlog, [Item(n)])
        for n in range(5):
            store.append(conn, "split", late, [Item(n)])

    def rows() -> list[tuple[int, str]]:
        with db.read() as conn:
            return [tuple(r) for r in conn.execute(select(applied).order_by(applied.c.position))]

    done = wait_until(
        lambda: meeting.broken or len(rows()) == BACKLOG + 5, timeout=60, what="the messages"
    )
    assert not meeting.broken, "the two partitions were not applied at the same time"
    assert done
    for source in (backlog, late):
        positions = [p for p, s in rows() if s == source]
        assert positions == sorted(positions)
