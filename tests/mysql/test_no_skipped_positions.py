"""Concurrent appenders that commit out of order never make a consumer skip a message."""

from __future__ import annotations

import random
import threading
import time
from functools import partial

import attrs
import pytest
from clusters import wait_until
from sqlalchemy import BigInteger, Column, MetaData, Table, insert, select

from messaging import (
    ConflictRetrySettings,
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
from messaging.distribution._ownership import Ownership
from messaging.store._retry import lock_conflict, retry_transient
from projections import projection

pytestmark = pytest.mark.mysql

metadata = MetaData()
applied = Table(
    "noskip_applied",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
)
RECORD = insert(applied)


@message("test.noskip.tick")
@attrs.define(frozen=True)
class Tick:
    writer: int
    n: int


@projection("noskip-recorder", topics="ticks", partitions=4, tables=[applied])
class Recorder:
    @handler
    def tick(self, event: Tick, ctx: HandlerContext) -> None:
        assert ctx.envelope is not None
        ctx.execute(RECORD, {"position": ctx.envelope.position})


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [metadata]


def _appender(
    db: Database, writer: int, rounds: int, slow: bool, errors: list[BaseException]
) -> None:
    store = MessageStore(db)
    rng = random.Random(writer)

    def append(n: int) -> None:
        with db.transaction() as conn:
            store.append(conn, "ticks", f"writer-{writer}", [Tick(writer, n)])
            if slow:
                # Hold the transaction open after taking a position: the deliberate
                # out-of-order commit the store must not let a reader skip past.
                time.sleep(rng.uniform(0.005, 0.05))

    try:
        for n in range(rounds):  # a lock wait past its bound (a loaded server) is retried,
            # as an application retries it; a lost connection is not (no duplicates here)
            retry_transient(
                partial(append, n),
                ConflictRetrySettings(max_retries=20),
                what="append",
                give_up=lambda exc: lock_conflict(exc) is None,
            )
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_slow_concurrent_appenders_never_make_the_consumer_skip(db: Database) -> None:
    """Every committed position is applied exactly once while 8 appenders race, half slow."""
    settings = settings_from_mapping(
        {
            "messaging": {
                "consumer": {
                    "batch-size": 7,
                    "idle-poll-interval": "10ms",
                    "rebalance-interval": "300ms",
                    "stale-instance-timeout": "2s",
                    "heartbeat-interval": "200ms",
                }
            }
        }
    )
    manager = create_plugin_manager([], plugins=[_Contribute()], load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="noskip")
    instance.start()
    errors: list[BaseException] = []
    writers = [
        threading.Thread(target=_appender, args=(db, w, 40, w % 2 == 0, errors)) for w in range(8)
    ]
    try:
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        assert not errors, errors

        m = db.schema.messages

        def caught_up() -> bool:
            with db.read() as conn:
                stored = set(
                    conn.execute(select(m.c.position).where(m.c.tenant == db.tenant)).scalars()
                )
                seen = set(conn.execute(select(applied.c.position)).scalars())
            return len(stored) == 8 * 40 and seen == stored

        wait_until(caught_up, timeout=60, what="the consumer to apply every committed position")
    finally:
        instance.stop()
    with db.read() as conn:
        statuses = {p.status for p in Ownership(db).partitions(conn, ["noskip-recorder"])}
    assert statuses == {"running"}  # no partition halted on a duplicate position


class _Contribute:
    @hookimpl
    def projections_consumers(self) -> list[type]:
        return [Recorder]
