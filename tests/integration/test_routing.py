"""Routing in process on a real database: the outbox, route consumers and the idempotency
guard, and two partitions updating one saga at once (resolved by its version)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import yaml
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from messaging import (
    Database,
    HandlerContext,
    MessageStore,
    handler,
    hookimpl,
    message,
    route_consumer,
)
from messaging._config import settings_from_mapping
from messaging._errors import ConcurrentUpdate
from messaging.store._clock import ManualClock
from messaging.store._rows import partition_of
from projections.testing import SimulatedCluster
from sagas import SagaContext, saga, start

SETTINGS = settings_from_mapping(
    {
        "messaging": {
            "consumer": {
                "rebalance-interval": "1s",
                "stale-instance-timeout": "3s",
                "heartbeat-interval": "400ms",
                "conflict-retry": {"max-retries": 3, "max-delay": "50ms"},
            }
        }
    }
)

metadata = MetaData()
effects = Table(
    "test_route_effects",
    metadata,
    Column("consumer", String(64), nullable=False),
    Column("item", String(64), nullable=False),
    Column("n", Integer, nullable=False),
)


@message("test-routing.ping")
@attrs.define(frozen=True)
class Ping:
    item: str


def _record(consumer: str) -> type:
    class Recorder:
        @handler
        def ping(self, command: Ping, ctx: HandlerContext) -> None:
            ctx.execute(insert(effects), {"consumer": consumer, "item": command.item, "n": 1})

    return Recorder


AtLeastOnce = route_consumer("test-plain", partitions=2, tables=[effects])(_record("plain"))
Idempotent = route_consumer("test-guarded", partitions=2, idempotent=True, tables=[effects])(
    _record("guarded")
)


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [metadata]


@pytest.fixture
def clock_db(db: Database) -> Database:
    """``db``'s tables, with a manual clock for a simulated cluster."""
    return Database(db.url, table_prefix=db.schema.prefix, clock=ManualClock())


def test_a_rolled_back_transaction_sends_nothing(db: Database) -> None:
    store = MessageStore(db)
    with pytest.raises(RuntimeError), db.transaction() as conn:
        store.send(conn, "test-plain", Ping("lost"))
        raise RuntimeError("the application's transaction fails")
    with db.transaction() as conn:
        sent = store.send(conn, "test-plain", Ping("kept"), key="k1")
    with db.read() as conn:
        rows = store.read(conn, ["test-plain"])
        envelopes = store.envelopes(conn, [r.position for r in rows])
    assert [r.source for r in rows] == ["k1"]
    assert envelopes[rows[0].position].message_id == sent


def test_the_guard_applies_a_message_id_once(clock_db: Database) -> None:
    """Each id sent twice (an at-least-once sender): the plain consumer applies both
    copies, the idempotent one applies each id once."""
    cluster = SimulatedCluster(clock_db, [AtLeastOnce, Idempotent], SETTINGS)
    cluster.join("a")
    store = MessageStore(clock_db)
    for _round in range(2):
        with clock_db.transaction() as conn:
            for i in range(30):
                for destination in ("test-plain", "test-guarded"):
                    store.send(conn, destination, Ping(f"i{i}"), message_id=f"{destination}-{i}")
        while cluster.poll_all():
            pass
    with clock_db.read() as conn:
        counts = {
            consumer: count
            for consumer, count in conn.execute(
                select(effects.c.consumer, func.count()).group_by(effects.c.consumer)
            )
        }
        guarded = conn.execute(
            select(effects.c.item).where(effects.c.consumer == "guarded")
        ).scalars()
        assert sorted(guarded) == sorted(f"i{i}" for i in range(30))
    assert counts == {"plain": 60, "guarded": 30}


@message("test-routing.increment")
@attrs.define(frozen=True)
class Increment:
    counter_id: str
    pause: bool = False


@attrs.define
class Count:
    value: int = 0


class _Gate:
    entered = threading.Event()
    release = threading.Event()
    paused = False


@saga("test-counter", topics="counts", correlate_by="counter_id", state=Count, partitions=4)
class Counter:
    @start
    def increment(self, event: Increment, ctx: SagaContext) -> None:
        if ctx.state is None:
            ctx.state = Count()
        ctx.state.value += 1
        if event.pause and not _Gate.paused:
            _Gate.paused = True
            _Gate.entered.set()
            assert _Gate.release.wait(10)


class _Conflicts:
    def __init__(self) -> None:
        self.seen = 0

    @hookimpl
    def projections_retrying(self, what: str, error: BaseException) -> None:
        if isinstance(error, ConcurrentUpdate):
            self.seen += 1


@pytest.mark.mysql
def test_two_partitions_updating_one_saga_are_serialized_by_its_version(
    mysql_database_url: str,
) -> None:
    """Instance a is inside its batch for counter c (message from one partition) when
    instance b commits another message of c (from another partition): a's write finds a
    newer version, its batch is retried from the start, and both increments count."""
    from messaging.store._migrations import migrate

    db = Database(mysql_database_url, table_prefix=f"t{uuid.uuid4().hex[:8]}_", clock=ManualClock())
    migrate(db)
    db.prepare()
    conflicts = _Conflicts()
    cluster = SimulatedCluster(db, [Counter], SETTINGS, plugins=[conflicts])
    cluster.join("a")
    cluster.join("b")
    for _ in range(4):
        cluster.tick()
    owners = cluster.owners()
    source_of = {
        owner: next(
            f"s{i}"
            for i in range(100)
            if owners[("test-counter", partition_of(f"s{i}", 4))] == owner
        )
        for owner in ("a", "b")
    }
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "counts", "starter", [Increment("c")])
    while cluster.poll_all():
        pass
    with db.transaction() as conn:
        store.append(conn, "counts", source_of["a"], [Increment("c", pause=True)])
        store.append(conn, "counts", source_of["b"], [Increment("c")])
    _Gate.entered.clear()
    _Gate.release.clear()
    _Gate.paused = False
    paused = threading.Thread(target=cluster.poll, args=("a",))
    paused.start()
    try:
        assert _Gate.entered.wait(10)
        assert cluster.poll("b") == 1  # commits while a is inside its batch
    finally:
        _Gate.release.set()
        paused.join(10)
    while cluster.poll_all():
        pass
    with db.read() as conn:
        state = conn.execute(select(db.schema.sagas.c.state)).scalar_one()
    assert json.loads(state) == {"value": 3}
    assert conflicts.seen == 1
    db.dispose()


def test_an_id_recorded_by_a_concurrent_batch_makes_the_batch_retry(
    clock_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches holding one id (sent twice with different keys, so to two partitions)
    both found it unhandled: the one that records it second is retried, not halted, and
    then skips it."""
    from messaging.routing._consumer import IdempotentDispatcher

    cluster = SimulatedCluster(clock_db, [Idempotent], SETTINGS)
    cluster.join("a")
    store = MessageStore(clock_db)
    with clock_db.transaction() as conn:
        store.send(conn, "test-guarded", Ping("x"), key="k1", message_id="same")
    while cluster.poll_all():
        pass
    retried: list[BaseException] = []
    real = IdempotentDispatcher._handled
    calls: Iterator[set[str] | None] = iter([set(), None])  # the first read misses the id

    def stale_then_real(
        self: IdempotentDispatcher, ctx: HandlerContext, ids: list[str]
    ) -> set[str]:
        first = next(calls)
        return first if first is not None else real(self, ctx, ids)

    monkeypatch.setattr(IdempotentDispatcher, "_handled", stale_then_real)
    with clock_db.transaction() as conn:
        store.send(conn, "test-guarded", Ping("x"), key="k2", message_id="same")
    worker = cluster.running["a"].workers["test-guarded"]
    monkeypatch.setattr(
        worker.hooks, "projections_retrying", lambda **kw: retried.append(kw["error"])
    )
    assert worker.poll() == 1  # applied on the retry: skipped as already handled
    assert [type(e) for e in retried] == [ConcurrentUpdate]
    with clock_db.read() as conn:
        rows = conn.execute(select(effects.c.item).where(effects.c.consumer == "guarded"))
        assert rows.scalars().all() == ["x"]


def test_old_handled_ids_can_be_forgotten(clock_db: Database, tmp_path: Path) -> None:
    """The guard's table only grows: an operator drops the ids handled long enough ago;
    one of those sent again is handled again, a newer one is still skipped."""
    from messaging._errors import OperationError
    from projections._operations import audit_log, forget_processed
    from projections.cli import main

    cluster = SimulatedCluster(clock_db, [Idempotent], SETTINGS)
    cluster.join("a")
    store = MessageStore(clock_db)

    def send(*ids: str) -> None:
        with clock_db.transaction() as conn:
            for message_id in ids:
                store.send(conn, "test-guarded", Ping(message_id), message_id=message_id)
        while cluster.poll_all():
            pass

    send("old-1", "old-2")
    cluster.clock.advance(100)
    send("new-1")
    assert forget_processed(clock_db, "test-guarded", older_than=50, who="ops") == 2
    send("old-1", "new-1")
    with clock_db.read() as conn:
        items = conn.execute(select(effects.c.item).where(effects.c.consumer == "guarded"))
        assert sorted(items.scalars()) == ["new-1", "old-1", "old-1", "old-2"]
    (entry,) = [e for e in audit_log(clock_db) if e["command"] == "forget-processed"]
    assert entry["detail"]["forgotten"] == 2 and entry["who"] == "ops"
    with pytest.raises(OperationError, match="unknown consumer 'nope'"):
        forget_processed(clock_db, "nope", older_than=1, who="ops")
    # From the command line, with the database's own clock (far past the manual one).
    config = {"database": clock_db.url, "table-prefix": clock_db.schema.prefix}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    command = ["forget-processed", "test-guarded", "--older-than", "1h", "--config", str(path)]
    assert main(command) == 0


def test_only_route_consumers_have_handled_ids_to_forget(clock_db: Database) -> None:
    from messaging._errors import OperationError
    from projections._operations import forget_processed

    cluster = SimulatedCluster(clock_db, [Counter], SETTINGS)
    cluster.join("a")
    with pytest.raises(OperationError, match="only route consumers record handled ids"):
        forget_processed(clock_db, "test-counter", older_than=1, who="ops")


def test_forget_processed_names_a_bad_duration(capsys: pytest.CaptureFixture[str]) -> None:
    from projections.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["forget-processed", "test-guarded", "--older-than", "7d"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--older-than: expected a duration like 10s or 500ms, got '7d'" in error
