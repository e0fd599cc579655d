"""Sagas in process on a real database with a manual clock: start, correlate, end,
commands sent through the outbox, deadlines scheduled, cancelled and delivered once."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import pytest
from clusters import manual_clock_database
from pymysql.cursors import RE_INSERT_VALUES
from sqlalchemy import event, select

from messaging import (
    Database,
    Distribution,
    HandlerContext,
    MessageStore,
    handler,
    message,
    route_consumer,
)
from messaging._config import settings_from_mapping
from messaging._errors import ConcurrentUpdate, RegistrationError
from messaging.distribution._ownership import Ownership
from messaging.store import _fastpath
from messaging.store._rows import partition_of
from projections.testing import SimulatedCluster
from sagas import SagaContext, SagaStore, saga, start
from sagas._rows import SagaRow

SETTINGS = settings_from_mapping(
    {
        "messaging": {
            "consumer": {
                "rebalance-interval": "1s",
                "stale-instance-timeout": "3s",
                "heartbeat-interval": "400ms",
                "batch-size": 50,
                "conflict-retry": {"max-retries": 3, "max-delay": "50ms"},
            }
        }
    }
)
PAYMENT_TIMEOUT = 10.0


@message("test-saga.order-placed")
@attrs.define(frozen=True)
class OrderPlaced:
    order_id: str
    amount: int


@message("test-saga.payment-received")
@attrs.define(frozen=True)
class PaymentReceived:
    order_id: str
    amount: int


@message("test-saga.payment-overdue")
@attrs.define(frozen=True)
class PaymentOverdue:
    order_id: str


@message("test-saga.ship")
@attrs.define(frozen=True)
class Ship:
    order_id: str


@message("test-saga.cancel")
@attrs.define(frozen=True)
class Cancel:
    order_id: str


@attrs.define
class OrderState:
    amount: int
    paid: int = 0


@saga("test-orders", topics="orders", correlate_by="order_id", state=OrderState, partitions=4)
class OrderSaga:
    @start
    def placed(self, event: OrderPlaced, ctx: SagaContext) -> None:
        ctx.state = OrderState(amount=event.amount)
        ctx.schedule(PaymentOverdue(event.order_id), after=PAYMENT_TIMEOUT)

    @handler
    def paid(self, event: PaymentReceived, ctx: SagaContext) -> None:
        ctx.state.paid += event.amount
        if ctx.state.paid >= ctx.state.amount:
            ctx.cancel(PaymentOverdue)
            ctx.send("test-shipping", Ship(ctx.key), key=ctx.key)
            ctx.end()

    @handler
    def overdue(self, event: PaymentOverdue, ctx: SagaContext) -> None:
        ctx.send("test-shipping", Cancel(ctx.key), key=ctx.key)
        ctx.end()


@message("test-saga.remind")
@attrs.define(frozen=True)
class Remind:
    order_id: str


@attrs.define
class ReminderState:
    reminded: int = 0


@saga("test-reminders", topics="orders", correlate_by="order_id", state=ReminderState, partitions=4)
class Reminders:
    """Schedules one reminder per order; delivering it only changes the state."""

    @start
    def placed(self, event: OrderPlaced, ctx: SagaContext) -> None:
        ctx.state = ReminderState()
        ctx.schedule(Remind(event.order_id), after=1.0)

    @handler
    def remind(self, event: Remind, ctx: SagaContext) -> None:
        ctx.state.reminded += 1


@route_consumer("test-shipping", partitions=2)
class Shipping:
    """Records every command it handles (a projection-like effect, for the test to read)."""

    handled: list[tuple[str, str]] = []

    @handler
    def ship(self, command: Ship, ctx: HandlerContext) -> None:
        Shipping.handled.append(("ship", command.order_id))

    @handler
    def cancel(self, command: Cancel, ctx: HandlerContext) -> None:
        Shipping.handled.append(("cancel", command.order_id))


@pytest.fixture
def cluster(database_url: str, table_prefix: str) -> SimulatedCluster:
    Shipping.handled = []
    return SimulatedCluster(
        manual_clock_database(database_url, table_prefix), [OrderSaga, Shipping], SETTINGS
    )


def _append(cluster: SimulatedCluster, *events: object) -> None:
    store = MessageStore(cluster.db)
    with cluster.db.transaction() as conn:
        for event in events:
            store.append(conn, "orders", f"src-{id(event)}", [event])


def _drain(cluster: SimulatedCluster) -> None:
    while cluster.poll_all():
        pass


def _saga_rows(db: Database) -> dict[str, tuple[int, bool]]:
    """Saga key → (amount paid, ended)."""
    t = db.schema.sagas
    with db.read() as conn:
        rows = conn.execute(
            select(t.c.saga_key, t.c.state, t.c.ended).where(t.c.tenant == db.tenant)
        )
        return {key: (json.loads(state)["paid"], bool(ended)) for key, state, ended in rows}


def _commands(db: Database) -> list[tuple[str, str]]:
    """The commands the sagas committed to ``test-shipping``: (kind, order)."""
    with db.read() as conn:
        rows = MessageStore(db).read(conn, ["test-shipping"], limit=10_000)
    return [(row.type.rsplit(".", 1)[1], json.loads(row.payload)["order_id"]) for row in rows]


def test_a_saga_starts_correlates_sends_and_ends(cluster: SimulatedCluster) -> None:
    """Placed starts an instance; payments for it (from other sources, so other partitions)
    update it by version; the full payment sends Ship and ends it; later messages are ignored."""
    cluster.join("a")
    _append(cluster, OrderPlaced("o1", 30), PaymentReceived("o1", 10))
    _drain(cluster)
    assert _saga_rows(cluster.db) == {"o1": (10, False)}
    _append(cluster, PaymentReceived("o1", 20), PaymentReceived("o1", 5), PaymentReceived("o2", 1))
    _drain(cluster)
    assert _saga_rows(cluster.db) == {"o1": (30, True)}  # o2 never started: ignored
    assert Shipping.handled == [("ship", "o1")]
    with cluster.db.read() as conn:
        assert SagaStore(cluster.db, "test-orders").pending(conn) == 0  # cancelled at the end


def test_a_deadline_is_delivered_once_when_due_and_not_before(cluster: SimulatedCluster) -> None:
    cluster.join("a")
    _append(cluster, OrderPlaced("late", 10))
    _drain(cluster)
    cluster.tick(PAYMENT_TIMEOUT - 1)
    _drain(cluster)
    assert Shipping.handled == []
    cluster.tick(1.5)
    _drain(cluster)
    _drain(cluster)
    assert Shipping.handled == [("cancel", "late")]
    assert _saga_rows(cluster.db) == {"late": (0, True)}


def test_deadlines_due_while_no_instance_ran_are_delivered_on_start(
    cluster: SimulatedCluster,
) -> None:
    cluster.join("a")
    _append(cluster, OrderPlaced("x1", 10), OrderPlaced("x2", 10))
    _drain(cluster)
    cluster.stop("a")
    cluster.clock.advance(PAYMENT_TIMEOUT * 3)
    cluster.join("b")
    _drain(cluster)
    assert sorted(Shipping.handled) == [("cancel", "x1"), ("cancel", "x2")]


def test_a_crashed_owner_leaves_its_deadlines_to_the_next_owner(
    cluster: SimulatedCluster,
) -> None:
    """Deadlines in the crashed instance's partitions are delivered by whoever takes them
    over, once; the zombie waking afterwards delivers nothing."""
    cluster.join("a")
    _append(cluster, *(OrderPlaced(f"c{i}", 10) for i in range(8)))
    _drain(cluster)
    cluster.pause("a")
    cluster.tick(PAYMENT_TIMEOUT)
    cluster.join("b")
    for _ in range(5):
        cluster.tick()
        _drain(cluster)
    cluster.wake("a")
    _drain(cluster)
    assert sorted(_commands(cluster.db)) == [("cancel", f"c{i}") for i in range(8)]
    assert set(Shipping.handled) == {("cancel", f"c{i}") for i in range(8)}


def test_a_saga_without_a_start_handler_is_refused(cluster: SimulatedCluster) -> None:
    @saga("test-no-start", topics="orders", correlate_by="order_id", state=OrderState)
    class NoStart:
        @handler
        def paid(self, event: PaymentReceived, ctx: SagaContext) -> None: ...

    with pytest.raises(RegistrationError, match="no @start handler"):
        SimulatedCluster(cluster.db, [NoStart], SETTINGS).join("a")


def test_a_saga_declared_wrongly_is_refused_naming_what_is_wrong(
    cluster: SimulatedCluster,
) -> None:
    with pytest.raises(RegistrationError, match="state must be an attrs class"):
        saga("test-bad", topics="orders", correlate_by="order_id", state=dict)
    with pytest.raises(RegistrationError, match="correlate_by must be an attribute name"):
        saga("test-bad", topics="orders", correlate_by="order id", state=OrderState)

    @saga("test-no-key", topics="orders", correlate_by="customer", state=OrderState)
    class NoKey:
        @start
        def placed(self, event: OrderPlaced, ctx: SagaContext) -> None: ...

    with pytest.raises(RegistrationError, match="has no attribute 'customer' to correlate"):
        SimulatedCluster(cluster.db, [NoKey], SETTINGS).join("a")
    with cluster.db.read() as conn:  # the failed start took its registration back
        assert conn.execute(select(cluster.db.schema.instances)).all() == []

    @saga("test-no-context", topics="orders", correlate_by="order_id", state=OrderState)
    class NoContext:
        @start
        def placed(self, event: OrderPlaced) -> None: ...

    with pytest.raises(RegistrationError, match=r"must take \(self, message, ctx\)"):
        SimulatedCluster(cluster.db, [NoContext], SETTINGS).join("b")


def test_route_consumers_and_sagas_take_their_distribution_from_the_config(
    cluster: SimulatedCluster,
) -> None:
    """`routing.consumers.<destination>` and `sagas.consumers.<name>` in the YAML: both
    single-owner here, so one instance owns all their partitions, the other none."""
    import yaml

    config = yaml.safe_load(
        """
        messaging: {consumer: {rebalance-interval: 1s, stale-instance-timeout: 3s,
                               heartbeat-interval: 400ms}}
        routing: {consumers: {test-shipping: {distribution: single-owner}}}
        sagas: {distribution: single-owner}
        """
    )
    single = SimulatedCluster(cluster.db, [OrderSaga, Shipping], settings_from_mapping(config))
    single.join("a")
    single.join("b")
    for _ in range(4):
        single.tick()
    owners = single.owners()
    for consumer in ("test-orders", "test-shipping"):
        holders = {owner for (name, _), owner in owners.items() if name == consumer}
        assert len(holders) == 1 and holders <= {"a", "b"}, (consumer, holders)
    assert {single.distributions["test-orders"], single.distributions["test-shipping"]} == {
        Distribution.SINGLE_OWNER
    }


def test_each_consumer_applies_batches_of_its_own_size(cluster: SimulatedCluster) -> None:
    """`batch-size` under a route consumer's and a saga's own keys: their workers fetch and
    commit batches of that size (the deadlines a saga delivers at once too)."""
    sized = SimulatedCluster(
        cluster.db,
        [OrderSaga, Shipping],
        settings_from_mapping(
            {
                "messaging": {"consumer": {"batch-size": 50}},
                "routing": {"consumers": {"test-shipping": {"batch-size": 2}}},
                "sagas": {"consumers": {"test-orders": {"batch-size": 3}}},
            }
        ),
    )
    workers = sized.join("a").workers
    _append(sized, *(OrderPlaced(f"b{i}", 1) for i in range(7)))
    assert [workers["test-orders"].poll() for _ in range(4)] == [3, 3, 1, 0]
    sized.clock.advance(PAYMENT_TIMEOUT)
    assert [workers["test-orders"].poll() for _ in range(4)] == [3, 3, 1, 0]  # deadlines
    while workers["test-shipping"].poll():  # in lanes on MySQL: batches of 2 at once
        pass
    batches = [c.count for c in sized.commits if c.consumer == "test-shipping"]
    assert sum(batches) == 7 and max(batches) == 2, batches


def _declared_again(partitions: int) -> type:
    @saga(
        "test-orders",
        topics="orders",
        correlate_by="order_id",
        state=OrderState,
        partitions=partitions,
        version=2,
    )
    class OrderSagaV2(OrderSaga):
        pass

    return OrderSagaV2


def test_a_new_saga_declaration_goes_on_from_its_checkpoints(cluster: SimulatedCluster) -> None:
    """Sagas are never rebuilt: replaying them would send their commands again."""
    cluster.join("a")
    _append(cluster, OrderPlaced("r1", 5), PaymentReceived("r1", 5))
    _drain(cluster)
    cluster.stop("a")
    again = SimulatedCluster(cluster.db, [_declared_again(4), Shipping], SETTINGS)
    again.join("b")
    _append(again, OrderPlaced("r2", 5), PaymentReceived("r2", 5))
    _drain(again)
    assert sorted(_commands(cluster.db)) == [("ship", "r1"), ("ship", "r2")]


def test_status_shows_the_version_a_saga_is_declared_with(cluster: SimulatedCluster) -> None:
    """A saga (never rebuilt) is reported at the version in its code: 1, then 2 once the
    code declaring version=2 runs; and 2 still when that code starts again unchanged; so
    do `projections versions` (that one version) and `projections health`."""
    from projections._reports import consumers_report

    def version() -> int:
        report = consumers_report(cluster.db, SETTINGS.messaging.consumer, names=["test-orders"])
        (entry,) = report["consumers"]
        return int(entry["version"])

    cluster.join("a")
    assert version() == 1
    cluster.stop("a")
    again = SimulatedCluster(cluster.db, [_declared_again(4), Shipping], SETTINGS)
    again.join("b")
    assert version() == 2
    again.stop("b")
    again.join("c")
    assert version() == 2
    from projections._version_commands import versions_report

    report = versions_report(cluster.db, SETTINGS.messaging.consumer, "test-orders")
    assert [(v["version"], v["role"]) for v in report["versions"]] == [(2, "live")]
    from projections._health import format_health, health_report

    health = health_report(cluster.db, SETTINGS, "test-orders")
    assert health["consumers"][0]["version"] == 2
    assert "test-orders  caught-up  (healthy; version 2)" in format_health(health)


def test_a_saga_cannot_change_its_partition_count(cluster: SimulatedCluster) -> None:
    cluster.join("a")
    cluster.stop("a")
    again = SimulatedCluster(cluster.db, [_declared_again(8), Shipping], SETTINGS)
    with pytest.raises(RegistrationError, match="runs with 4 partitions; it cannot change to 8"):
        again.join("b")


def test_rebuilding_a_saga_is_refused(cluster: SimulatedCluster) -> None:
    from messaging._errors import OperationError
    from projections._operations import rebuild

    cluster.join("a")
    with pytest.raises(OperationError, match="only projections can be rebuilt"):
        rebuild(cluster.db, "test-orders", who="test")


def _store_deadlines(cluster: SimulatedCluster, dues: Mapping[int, Sequence[float]]) -> None:
    """Deadlines of saga ``test-orders``: per partition, one per offset from the clock."""
    db = cluster.db
    with db.transaction() as conn:
        conn.execute(
            db.schema.deadlines.insert(),
            [
                {
                    "tenant": db.tenant,
                    "saga": "test-orders",
                    "saga_key": f"p{partition}-{i}",
                    "name": "PaymentOverdue",
                    "partition_no": partition,
                    "due_at": cluster.clock.value + offset,
                    "type": "test-saga.payment-overdue",
                    "payload": "{}",
                    "scheduled_at": 0.0,
                }
                for partition, offsets in dues.items()
                for i, offset in enumerate(offsets)
            ],
        )
        if not db.is_sqlite:
            conn.exec_driver_sql(f"ANALYZE TABLE {db.schema.deadlines.name}")


def test_due_deadlines_are_read_per_partition_in_index_order(cluster: SimulatedCluster) -> None:
    """The due-deadline lookup reads each partition as a range of the (tenant, saga,
    partition, due_at) index in due order, on both backends: no sort of the overdue
    backlog (MySQL's filesort, SQLite's temporary B-tree), however many are overdue."""
    db = cluster.db
    # many pending, few due: a plan worth choosing
    _store_deadlines(cluster, {p: [i if i % 100 else -1 for i in range(750)] for p in range(4)})
    query = SagaStore(db, "test-orders").due_query({0: 17, 2: 17, 3: 17})
    compiled = query.compile(db.engine, compile_kwargs={"literal_binds": True})
    with db.read() as conn:
        if db.is_sqlite:
            steps = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")
            plan = " ".join(str(r[-1]) for r in steps)
        else:
            rows = conn.exec_driver_sql(f"EXPLAIN {compiled}").mappings()
            plan = " ".join(f"{r['key']} {r['Extra']}" for r in rows if r["key"])
    assert plan.count("ix_deadlines_due") == 3, plan
    assert "filesort" not in plan and "TEMP B-TREE" not in plan, plan


def test_a_batch_of_due_deadlines_is_each_partitions_earliest_and_full(
    cluster: SimulatedCluster,
) -> None:
    """Partitions with few due deadlines leave their share to the others: the batch is
    still full, and of each partition it holds the earliest due ones."""
    offsets = {0: [-100 + i for i in range(90)], 1: [-50, -40, -30], 2: [], 3: [5, 6]}
    _store_deadlines(cluster, offsets)
    store = SagaStore(cluster.db, "test-orders")
    with cluster.db.read() as conn:
        batch = store.due(conn, range(4), 40).deadlines
        everything = store.due(conn, range(4), 1000).deadlines
    assert len(batch) == 40
    assert [d.due_at for d in batch] == sorted(d.due_at for d in batch)
    taken = {
        p: sorted(d.due_at - cluster.clock.value for d in batch if d.partition == p)
        for p in range(4)
    }
    assert taken[1] == [-50, -40, -30] and not taken[2] and not taken[3]
    assert taken[0] == pytest.approx(offsets[0][:37])
    assert len(everything) == 93  # partition 3's are not due


def test_a_deadline_without_a_handler_halts_at_the_message_that_scheduled_it(
    cluster: SimulatedCluster,
) -> None:
    @saga("test-bad-deadline", topics="orders", correlate_by="order_id", state=OrderState)
    class BadDeadline:
        @start
        def placed(self, event: OrderPlaced, ctx: SagaContext) -> None:
            ctx.state = OrderState(amount=event.amount)
            ctx.schedule(Ship(event.order_id), after=1)  # Ship has no handler here

    bad = SimulatedCluster(cluster.db, [BadDeadline], SETTINGS)
    bad.join("a")
    _append(bad, OrderPlaced("b1", 1))
    _drain(bad)
    with cluster.db.read() as conn:
        rows = Ownership(cluster.db).partitions(conn, ["test-bad-deadline"])
    (halted,) = [r for r in rows if r.status == "halted"]
    assert halted.halted_type == "test-saga.order-placed"
    assert "no handler for" in (halted.error or "")


def test_sagas_start_and_deadlines_are_delivered_in_a_constant_number_of_round_trips(
    cluster: SimulatedCluster,
) -> None:
    """Scheduling, taking the deadlines and saving the saga states are batched statements,
    each one round trip on MySQL (multi-row INSERTs and upserts, DELETEs of a list of
    keys), so a batch costs the same few round trips however many sagas it starts or
    deadlines it delivers (an executemany of an UPDATE or a DELETE, which PyMySQL sends
    row by row, kept deliveries round-trip bound at ~5,000/s in benchmarks/deadlines.py)."""
    reminders = SimulatedCluster(cluster.db, [Reminders], SETTINGS)
    reminders.join("a")
    _append(reminders, *(OrderPlaced(f"r{i}", 1) for i in range(40)))
    with _statements(reminders.db) as starting:
        assert reminders.poll_all() == 40  # one batch (batch-size 50), nothing due yet
    reminders.clock.advance(2.0)
    with _statements(reminders.db) as delivering:
        assert reminders.poll_all() == 40
    assert _round_trips(reminders.db, starting) <= 12, starting
    # + the kit's own read that no deadline overtook a message (a transaction, two queries)
    assert _round_trips(reminders.db, delivering) <= 12 + 3, delivering
    t = reminders.db.schema.sagas
    with reminders.db.read() as conn:
        states = conn.execute(select(t.c.state).where(t.c.saga == "test-reminders")).scalars()
        assert sorted(json.loads(state)["reminded"] for state in states) == [1] * 40
        assert SagaStore(reminders.db, "test-reminders").pending(conn) == 0


@contextmanager
def _statements(db: Database) -> Iterator[list[tuple[str, int]]]:
    """The SQL statements sent meanwhile, each with its number of parameter sets (0 for a
    single execute)."""
    sent: list[tuple[str, int]] = []

    def record(
        _conn: object, _cursor: object, statement: str, params: Any, _ctx: object, many: bool
    ) -> None:
        sent.append((statement, len(params) if many else 0))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def _round_trips(db: Database, sent: list[tuple[str, int]]) -> int:
    """The round trips made for ``sent``: one per statement (SQLite runs an executemany in
    the process; the ``COMMIT`` and ``BEGIN IMMEDIATE`` with which a batch begun deferred
    takes the write lock are not counted: MySQL sends neither), but PyMySQL makes one per
    parameter set for an executemany that is not an ``INSERT ... VALUES`` (it joins only
    those into one multi-row statement, as its own pattern tells)."""
    if db.is_sqlite:
        return len(sent) - 2 * sum(1 for statement, _ in sent if statement == "BEGIN IMMEDIATE")
    return sum(
        1 if sets == 0 or RE_INSERT_VALUES.match(statement) else sets for statement, sets in sent
    )


def test_batched_takes_and_saves_still_detect_a_concurrent_change(
    cluster: SimulatedCluster,
) -> None:
    """One deadline of a batch cancelled, or one saga of a batch updated, after they were
    read: the whole batch fails with ConcurrentUpdate and its transaction changes nothing."""
    reminders = SimulatedCluster(cluster.db, [Reminders], SETTINGS)
    reminders.join("a")
    _append(reminders, *(OrderPlaced(f"k{i}", 1) for i in range(3)))
    _drain(reminders)
    db = reminders.db
    store = SagaStore(db, "test-reminders")
    with db.read() as conn:
        assert not store.any_due(conn, range(4))  # due in one second
    reminders.clock.advance(2.0)
    with db.read() as conn:
        assert store.any_due(conn, range(4))
        due = store.due(conn, range(4), 10).deadlines
        rows = store.load(conn, ["k0", "k1", "k2"])
    assert len(due) == 3
    with db.transaction() as conn:
        now = store.now(conn)
        store.unschedule(conn, ["k1"])
        store.save(conn, {"k2": '{"reminded": 5}'}, rows, set(), now)
    with pytest.raises(ConcurrentUpdate, match="1 of 3 deadlines"), db.transaction() as conn:
        store.take(conn, due)
    with pytest.raises(ConcurrentUpdate, match="1 of 3 instances"), db.transaction() as conn:
        store.save(conn, dict.fromkeys(("k0", "k1", "k2"), '{"reminded": 9}'), rows, set(), now)
    with pytest.raises(ConcurrentUpdate, match="started concurrently"), db.transaction() as conn:
        new = {k: SagaRow(key=k, version=None, state=None, ended=False) for k in ("k9", "k0")}
        store.save(conn, dict.fromkeys(new, "{}"), new, set(), now)
    with db.read() as conn:
        assert store.pending(conn) == 2
        assert sorted(store.load(conn, ["k0", "k1", "k2", "k9"])) == ["k0", "k1", "k2"]
        assert store.load(conn, ["k0"])["k0"].version == 1


def test_saved_states_reach_the_driver_as_the_tuples_they_are_built_as(
    cluster: SimulatedCluster,
) -> None:
    """Once learnt, the update of stored states hands each row's tuple to the driver as it
    is (the driver's order is the one the store builds rows in: no mapping per row), and
    moves each instance on by one version."""
    reminders = SimulatedCluster(cluster.db, [Reminders], SETTINGS)
    reminders.join("a")
    _append(reminders, *(OrderPlaced(f"k{i}", 1) for i in range(3)))
    _drain(reminders)
    db, store = reminders.db, SagaStore(reminders.db, "test-reminders")
    keys = ["k0", "k1", "k2"]
    for _ in range(2):
        with db.transaction() as conn:
            rows = store.load(conn, keys)
            store.save(conn, dict.fromkeys(keys, '{"reminded": 7}'), rows, {"k1"}, store.now(conn))
    names = store._update_row
    _statement, plan = _fastpath._plans(db.engine.dialect)[
        (id(store._update), frozenset(names), True)
    ]
    assert plan is not None and plan.order == names
    with db.read() as conn:
        after = store.load(conn, keys)
    for key in keys:
        read = rows[key].version
        assert read is not None
        assert (after[key].version, after[key].state, after[key].ended) == (
            read + 1,
            '{"reminded": 7}',
            key == "k1",
        )


def test_an_idle_saga_worker_wakes_when_its_next_deadline_falls_due(
    cluster: SimulatedCluster,
) -> None:
    """Not up to one idle-poll-interval later: the wait ends at the due time."""
    instance = cluster.join("a")
    worker = instance.workers["test-orders"]
    idle = SETTINGS.messaging.consumer.idle_poll_interval
    _append(cluster, OrderPlaced("w1", 5))
    _drain(cluster)
    assert worker.idle_wait() == idle  # due in 10 s: nothing to wake for
    cluster.clock.advance(PAYMENT_TIMEOUT - 0.05)
    assert cluster.poll_all() == 0
    assert 0 < worker.idle_wait() <= 0.05
    cluster.clock.advance(0.05)
    assert worker.poll() == 1  # the deadline
    assert worker.idle_wait() == idle


@message("test-saga.alarm")
@attrs.define(frozen=True)
class Alarm:
    order_id: str
    which: str


@attrs.define
class Alarms:
    rang: list[str] = attrs.field(factory=list)


@saga("test-alarms", topics="orders", correlate_by="order_id", state=Alarms, partitions=4)
class AlarmSaga:
    """Placing sets alarms "a" (1 s) and "b" (2 s); alarm "a" cancels "b"; an order
    "bad-…" has an alarm whose handler fails (due first, at 0.5 s)."""

    @start
    def placed(self, event: OrderPlaced, ctx: SagaContext) -> None:
        ctx.state = Alarms()
        first = 0.5 if ctx.key.startswith("bad-") else 1  # due before the others
        ctx.schedule(Alarm(event.order_id, "a"), after=first, name="a")
        ctx.schedule(Alarm(event.order_id, "b"), after=2, name="b")

    @handler
    def rings(self, event: Alarm, ctx: SagaContext) -> None:
        if ctx.key.startswith("bad-"):
            raise RuntimeError("the alarm bell is broken")
        ctx.state.rang.append(event.which)
        if event.which == "a":
            ctx.cancel("b")


def _alarms(db: Database) -> dict[str, list[str]]:
    t = db.schema.sagas
    with db.read() as conn:
        rows = conn.execute(select(t.c.saga_key, t.c.state).where(t.c.saga == "test-alarms")).all()
    return {key: json.loads(state)["rang"] for key, state in rows}


def test_a_deadline_cancelled_by_one_delivered_just_before_it_is_not_delivered(
    cluster: SimulatedCluster,
) -> None:
    """Both alarms are overdue together (nothing ran meanwhile): "a" cancels "b"."""
    alarms = SimulatedCluster(cluster.db, [AlarmSaga], SETTINGS)
    alarms.join("a")
    _append(alarms, OrderPlaced("z1", 1))
    _drain(alarms)
    alarms.stop("a")
    alarms.clock.advance(5)
    alarms.join("b")
    _drain(alarms)
    assert _alarms(cluster.db) == {"z1": ["a"]}


def test_a_failing_deadline_halts_its_partition_and_the_others_are_delivered(
    cluster: SimulatedCluster,
) -> None:
    alarms = SimulatedCluster(cluster.db, [AlarmSaga], SETTINGS)
    alarms.join("a")
    keys = [f"k{i}" for i in range(6)]
    _append(alarms, OrderPlaced("bad-1", 1), *(OrderPlaced(k, 1) for k in keys))
    _drain(alarms)
    alarms.clock.advance(1.5)
    _drain(alarms)
    bad_partition = partition_of("bad-1", 4)
    with cluster.db.read() as conn:
        rows = Ownership(cluster.db).partitions(conn, ["test-alarms"])
    (halted,) = [r for r in rows if r.status == "halted"]
    assert halted.partition == bad_partition
    assert halted.halted_type == "test-saga.alarm"
    assert "deadline 'a' of saga instance 'bad-1'" in (halted.error or "")
    assert "the alarm bell is broken" in (halted.error or "")
    rang = _alarms(cluster.db)
    for key in keys:
        assert rang[key] == ([] if partition_of(key, 4) == bad_partition else ["a"]), key


def test_a_state_that_cannot_be_stored_halts_at_its_message(cluster: SimulatedCluster) -> None:
    """The state is encoded right after each handler: the failure names its message, and
    the messages before it in the batch commit."""

    @saga("test-unstorable", topics="orders", correlate_by="order_id", state=OrderState)
    class Unstorable:
        @start
        def placed(self, event: OrderPlaced, ctx: SagaContext) -> None:
            amount: object = object() if event.order_id == "u2" else event.amount
            ctx.state = OrderState(amount=amount)  # type: ignore[arg-type]

    bad = SimulatedCluster(cluster.db, [Unstorable], SETTINGS)
    bad.join("a")
    store = MessageStore(cluster.db)
    with cluster.db.transaction() as conn:  # one source: one partition, one batch
        positions = [
            store.append(conn, "orders", "one-source", [OrderPlaced(f"u{i}", 1)])[0]
            for i in (1, 2, 3)
        ]
    _drain(bad)
    with cluster.db.read() as conn:
        rows = Ownership(cluster.db).partitions(conn, ["test-unstorable"])
    (halted,) = [r for r in rows if r.status == "halted"]
    assert halted.halted_position == positions[1]
    assert halted.checkpoint == positions[0]


def test_behind_a_backlog_only_deadlines_due_by_its_applied_messages_go(
    cluster: SimulatedCluster,
) -> None:
    """Payments recorded before the deadline fell due are applied before it; payments
    recorded after do not hold it back."""
    cluster.join("a")
    _append(cluster, OrderPlaced("o-late", 100))
    _drain(cluster)
    backlog = [PaymentReceived("unknown", 1) for _ in range(120)]  # 3 batches of 50
    _append(cluster, *backlog[:60], PaymentReceived("o-late", 100), *backlog[60:])
    cluster.clock.advance(PAYMENT_TIMEOUT + 1)
    worker = cluster.running["a"].workers["test-orders"]
    while worker.poll():
        pass
    assert _commands(cluster.db) == [("ship", "o-late")]  # paid in time: no Cancel
    _append(cluster, OrderPlaced("o-2", 100))
    _drain(cluster)
    cluster.clock.advance(PAYMENT_TIMEOUT + 1)
    _append(cluster, *backlog)  # recorded after o-2's deadline fell due
    assert worker.poll() == 50 + 1  # a full batch, then the deadline all the same
    assert ("cancel", "o-2") in _commands(cluster.db)


def test_a_pulsed_saga_worker_reads_its_topics_only_when_something_may_be_new(
    cluster: SimulatedCluster,
) -> None:
    """Under a pulse, a poll after a read of the topics that found nothing skips the read
    (deadlines are still looked at); a wake (the pulse saw a head move) makes the next
    poll read them and apply what came."""
    instance = cluster.join("a")
    worker = instance.workers["test-orders"]
    _append(cluster, OrderPlaced("p1", 5))
    _drain(cluster)
    worker.pulsed = True  # as a running instance's pulse sets it
    messages = cluster.db.schema.messages.name

    def topic_reads(polls: int) -> tuple[int, int]:
        with _statements(cluster.db) as sent:
            applied = sum(worker.poll() for _ in range(polls))
        reads = [s for s, _ in sent if f"FROM {messages}" in s and "ORDER BY" in s]
        return len(reads), applied

    assert topic_reads(3) == (0, 0)  # the drain's last read found nothing
    _append(cluster, OrderPlaced("p2", 5))  # no pulse here: nobody wakes the worker
    assert topic_reads(1) == (0, 0)
    worker.wake()
    assert topic_reads(1) == (1, 1)
    assert topic_reads(2) == (1, 0)  # read once more after a batch, then quiet
    assert set(_saga_rows(cluster.db)) == {"p1", "p2"}


def test_a_deadline_never_overtakes_a_message_of_its_partition_recorded_before_it_fell_due(
    cluster: SimulatedCluster,
) -> None:
    """A payment recorded before the deadline fell due, but not read by the worker yet
    (no wake told it), is applied before the deadline: the delivery looks for it in its
    own transaction, holds the deadline back and reads the topics again."""
    instance = cluster.join("a")
    worker = instance.workers["test-orders"]
    store = MessageStore(cluster.db)
    with cluster.db.transaction() as conn:
        store.append(conn, "orders", "o-in-time", [OrderPlaced("o-in-time", 10)])
    _drain(cluster)
    worker.pulsed = True  # as under a running instance's pulse; no pulse wakes it here
    cluster.clock.advance(PAYMENT_TIMEOUT - 0.5)
    with cluster.db.transaction() as conn:  # the reply, in the saga's partition
        store.append(conn, "orders", "o-in-time", [PaymentReceived("o-in-time", 10)])
    cluster.clock.advance(1.0)  # now the deadline is due
    worker.poll()  # the topics' read is skipped (nothing woke it): the deadline must wait
    assert _commands(cluster.db) == []
    _drain(cluster)
    assert _commands(cluster.db) == [("ship", "o-in-time")]
    assert _saga_rows(cluster.db) == {"o-in-time": (10, True)}


def test_an_instance_says_at_start_which_declared_consumers_it_does_not_run(
    cluster: SimulatedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.join("a")  # declares the saga and the route consumer
    caplog.set_level("INFO", logger="messaging.runtime.instance")
    SimulatedCluster(cluster.db, [Shipping], SETTINGS).join("b")
    said = [r.getMessage() for r in caplog.records if "does not run" in r.getMessage()]
    assert said == [
        "instance b does not run test-orders: declared in the database, not by its code"
    ]
