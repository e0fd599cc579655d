"""Concurrency limits: a projection's batches run in parallel on one instance up to its
concurrency-limit, never above it, and all consumers together up to executor.max-workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import attrs
import pytest
from clusters import wait_until
from sqlalchemy import BigInteger, Column, MetaData, Table, func, insert, select

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
from projections import projection

pytestmark = pytest.mark.mysql

metadata = MetaData()
seen = Table(
    "conc_seen",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("consumer", BigInteger, nullable=False),
)


class InFlight:
    """Handlers currently running, per consumer and in all, with the maxima seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def enter(self, consumer: str) -> None:
        with self.lock:
            for key in (consumer, "all"):
                self.now[key] = self.now.get(key, 0) + 1
                self.most[key] = max(self.most.get(key, 0), self.now[key])

    def leave(self, consumer: str) -> None:
        with self.lock:
            for key in (consumer, "all"):
                self.now[key] -= 1


IN_FLIGHT = InFlight()


@message("test.conc.work")
@attrs.define(frozen=True)
class Work:
    n: int


def _recorder(name: str, number: int) -> type:
    @projection(name, topics="work", partitions=8, tables=[seen])
    class Recorder:
        @handler
        def work(self, event: Work, ctx: HandlerContext) -> None:
            IN_FLIGHT.enter(name)
            try:
                time.sleep(0.01)  # slow work, so that parallel batches overlap
                ctx.execute(
                    insert(seen),
                    {"position": ctx.envelope.position * 10 + number, "consumer": number},
                )
            finally:
                IN_FLIGHT.leave(name)

    return Recorder


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [metadata]


@pytest.fixture
def running(db: Database) -> Iterator[Instance]:
    IN_FLIGHT.__init__()  # type: ignore[misc]
    consumers = [_recorder("conc-a", 1), _recorder("conc-b", 2)]

    class Contribute:
        @hookimpl
        def projections_consumers(self) -> list[type]:
            return consumers

    settings = settings_from_mapping(
        {
            "messaging": {
                "consumer": {
                    "batch-size": 10,
                    "idle-poll-interval": "20ms",
                    "executor": {"max-workers": 3},
                }
            },
            "projections": {"consumers": {"conc-a": {"concurrency-limit": 2}}},
        }
    )
    manager = create_plugin_manager([], plugins=[Contribute()], load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="conc")
    with db.transaction() as conn:
        store = MessageStore(db)
        for n in range(240):
            store.append(conn, "work", f"source-{n % 40}", [Work(n)])
    instance.start()
    yield instance
    instance.stop()


def test_batches_run_in_parallel_up_to_the_limits_and_never_above(
    db: Database, running: Instance
) -> None:
    """conc-a (limit 2) and conc-b (max-workers 3) overlap, within their limits and 3 in all."""

    def done() -> bool:
        with db.read() as conn:
            return conn.execute(select(func.count()).select_from(seen)).scalar_one() == 480

    wait_until(done, timeout=120, what="both consumers to apply every message")
    assert IN_FLIGHT.most["conc-a"] == 2
    assert 2 <= IN_FLIGHT.most["conc-b"] <= 3
    assert IN_FLIGHT.most["all"] <= 3
