"""Lanes share one read: a consumer applied in parallel lanes on MySQL reads each batch
once, so its reads examine about as many rows as they return, and a lane whose
partitions get no messages does not rescan the stream at every idle poll.

And a partition is not held behind another partition's backlog while a lane is free: the
lanes of a read are made of whole partitions at each read, so two partitions with
messages go to two lanes and are applied at the same time. Lanes used to be fixed as
``p % lanes``: partitions 0 and 4 of a 4-lane consumer shared a lane, and 4's messages
waited behind 0's backlog with three lanes idle (16 instances owning 8 of 128 partitions
each left some lanes with none and others with three)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import attrs
import pytest
from clusters import wait_until
from sqlalchemy import BigInteger, Column, MetaData, String, Table, event, func, insert, select

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
from messaging.applying._worker import ConsumerWorker
from messaging.store._rows import partition_of
from projections import projection

pytestmark = pytest.mark.mysql

PARTITIONS = 8
LANES = 4
BACKLOG = 30
metadata = MetaData()
applied = Table(
    "lane_applied",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
)
split_applied = Table(
    "lane_split_applied",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("source", String(20), nullable=False),
)
meeting = threading.Barrier(2)
"""The first message of each of two partitions waits here for the other's."""


@message("test.lanes.item")
@attrs.define(frozen=True)
class Item:
    n: int


@projection("lane-items", topics="items", partitions=PARTITIONS, tables=[applied])
class LaneItems:
    @handler
    def item(self, event: Item, ctx: HandlerContext) -> None:
        ctx.execute(insert(applied), {"position": ctx.envelope.position})


@projection("lane-split", topics="split", partitions=PARTITIONS, tables=[split_applied])
class LaneSplit:
    @handler
    def item(self, event: Item, ctx: HandlerContext) -> None:
        if event.n == 0:
            meeting.wait(timeout=30)  # broken (and the partition halted) unless concurrent
        row = {"position": ctx.envelope.position, "source": ctx.envelope.source}
        ctx.execute(insert(split_applied), row)


class ReadCounter:
    """Rows the server walked (``Handler_read_next``) and rows it returned, summed over the
    batch reads of the messages table on ``db``'s connections."""

    def __init__(self, db: Database) -> None:
        self.table = db.schema.messages.name
        self.examined = 0
        self.returned = 0
        self.reads = 0
        self.engine = db.engine
        event.listen(self.engine, "before_cursor_execute", self._before)
        event.listen(self.engine, "after_cursor_execute", self._after)

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._before)
        event.remove(self.engine, "after_cursor_execute", self._after)

    def _is_batch_read(self, statement: str) -> bool:
        return (
            statement.startswith("SELECT")
            and f"FROM {self.table}" in statement
            and ("ORDER BY" in statement)
        )

    @staticmethod
    def _walked(cursor: Any) -> int:
        probe = cursor.connection.cursor()
        probe.execute("SHOW SESSION STATUS LIKE 'Handler_read_next'")
        ((_, value),) = probe.fetchall()
        probe.close()
        return int(value)

    def _before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if self._is_batch_read(statement):
            conn.info["walked_before"] = self._walked(cursor)

    def _after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if self._is_batch_read(statement):
            returned = cursor.rowcount
            self.examined += self._walked(cursor) - conn.info.pop("walked_before")
            self.returned += returned
            self.reads += 1


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [metadata]


@pytest.fixture
def counter(db: Database) -> Iterator[ReadCounter]:
    reads = ReadCounter(db)
    yield reads
    reads.close()


@contextmanager
def _running(db: Database, consumer: type, batch_size: int) -> Iterator[Instance]:
    """A running instance of ``consumer`` with four lanes and 20 ms idle polls."""

    class Contribute:
        @hookimpl
        def projections_consumers(self) -> list[type]:
            return [consumer]

    options = {"batch-size": batch_size, "idle-poll-interval": "20ms"}
    lanes = {"executor": {"max-workers": LANES}}
    settings = settings_from_mapping({"messaging": {"consumer": {**options, **lanes}}})
    manager = create_plugin_manager([], plugins=[Contribute()], load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="lanes")
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def worker(db: Database, counter: ReadCounter) -> Iterator[ConsumerWorker]:
    """The consumer's worker on a running instance, with four lanes, 20 ms idle polls."""
    with _running(db, LaneItems, 25) as instance:
        yield instance.workers["lane-items"]


def _reads_at_least(counter: ReadCounter, reads: int) -> bool:
    return counter.reads >= reads


def _append(db: Database, sources: list[str], rounds: int) -> int:
    store = MessageStore(db)
    with db.transaction() as conn:
        for n in range(rounds):
            for source in sources:
                store.append(conn, "items", source, [Item(n)])
    return rounds * len(sources)


def _wait_applied(db: Database, count: int) -> None:
    def done() -> bool:
        with db.read() as conn:
            return conn.execute(select(func.count()).select_from(applied)).scalar_one() == count

    wait_until(done, timeout=60, what=f"{count} messages applied")


def test_lanes_share_one_read_and_idle_lanes_do_not_rescan(
    db: Database, worker: ConsumerWorker, counter: ReadCounter
) -> None:
    """Rows examined stay close to rows returned, with traffic in every lane and with
    traffic in one lane only; idle polls afterwards examine next to nothing."""
    assert worker.lanes == LANES
    by_lane: dict[int, list[str]] = {}
    for n in range(400):
        lane = partition_of(f"s{n}", PARTITIONS) % LANES
        by_lane.setdefault(lane, []).append(f"s{n}")
    every_lane = [sources[0] for _, sources in sorted(by_lane.items())]
    total = _append(db, every_lane, 50)
    _wait_applied(db, total)
    total += _append(db, by_lane[0][:4], 50)  # one lane busy, three without messages
    _wait_applied(db, total)
    busy = (counter.examined, counter.returned, counter.reads)
    for n in range(1, 21):  # an idle worker waits for news: wake it as its pulse would
        worker.wake()
        wait_until(partial(_reads_at_least, counter, busy[2] + n), timeout=30, what="idle reads")
    idle = counter.examined - busy[0]
    assert busy[1] == total
    assert busy[0] <= 1.1 * busy[1], f"reads examined {busy[0]} rows to return {busy[1]}"
    assert idle <= LANES, f"20 idle reads examined {idle} rows"


def test_a_partition_is_not_held_behind_the_backlog_of_its_old_lane_mate(db: Database) -> None:
    backlog, late = (  # partitions 0 and 4: one lane as p % 4
        next(f"s{n}" for n in range(99) if partition_of(f"s{n}", PARTITIONS) == p) for p in (0, 4)
    )
    meeting.reset()
    with _running(db, LaneSplit, 10):
        store = MessageStore(db)
        with db.transaction() as conn:  # 4 after 0's backlog, both in one read
            for n in range(BACKLOG):
                store.append(conn, "split", backlog, [Item(n)])
            for n in range(5):
                store.append(conn, "split", late, [Item(n)])

        def rows() -> list[tuple[int, str]]:
            order = split_applied.c.position
            with db.read() as conn:
                return [
                    (r.position, r.source)
                    for r in conn.execute(select(split_applied).order_by(order))
                ]

        done = wait_until(
            lambda: meeting.broken or len(rows()) == BACKLOG + 5, timeout=60, what="the messages"
        )
        assert not meeting.broken, "the two partitions were not applied at the same time"
        assert done
        for source in (backlog, late):
            positions = [p for p, s in rows() if s == source]
            assert positions == sorted(positions)
