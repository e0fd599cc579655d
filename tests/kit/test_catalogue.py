"""The catalogue of common consumer bugs: each broken consumer is caught by the testing
kit's defaults (``run_machine(Machine)``, nothing tuned) in seconds, on SQLite and on
MariaDB, with a sentence naming the scenario and the kind of bug; each correct version
passes. Bugs an earlier scenario catches first are also run against the scenario that
catches them again (the lost acknowledgement). The search alone (no battery) finds state
kept in the instance and reports it, shrinking included, within a minute."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar, cast

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    insert,
    select,
    update,
)

from messaging import HandlerContext, handler, message, route_consumer
from projections import projection
from projections.testing import BATTERY, Append, ClusterMachine, machine_settings, messages_of
from projections.testing.plugin import RunMachine
from projections.testing.runner import run_cluster_machine
from sagas import SagaContext, saga, start

C = TypeVar("C", bound=type)

SKUS = ["sku-0", "sku-1", "sku-2"]
TOPIC = "cat-stock"
CAUGHT_WITHIN = 10.0
"""Seconds of CPU the defaults may take to catch a catalogued bug."""
REPORTED_WITHIN = 60.0


@message("catalogue.stocked")
@attrs.define(frozen=True)
class Stocked:
    sku: str


@message("catalogue.added")
@attrs.define(frozen=True)
class Added:
    sku: str
    qty: int


metadata = MetaData()
stock = Table(
    "cat_stock",
    metadata,
    Column("sku", String(64), primary_key=True),
    Column("qty", BigInteger, nullable=False),
    Column("entries", Integer, nullable=False),
    Column("stamp", String(64), nullable=False),
)
STOCK_ITEM = insert(stock).values(sku=bindparam("item"), qty=0, entries=0, stamp="")
ADD = (
    update(stock)
    .where(stock.c.sku == bindparam("item"))
    .values(qty=stock.c.qty + bindparam("n"), entries=stock.c.entries + 1)
)
SET = (
    update(stock)
    .where(stock.c.sku == bindparam("item"))
    .values(qty=bindparam("total"), entries=bindparam("count"))
)
STAMP = update(stock).where(stock.c.sku == bindparam("item")).values(stamp=bindparam("value"))


def _stocked(self: object, event: Stocked, ctx: HandlerContext) -> None:
    ctx.execute(STOCK_ITEM, {"item": event.sku})


def _stock_projection(name: str) -> Callable[[C], C]:
    """A stock projection class whose ``stocked`` handler creates each item's row."""
    return projection(name, topics=TOPIC, partitions=4, tables=[stock])


@_stock_projection("cat-stock")
class Stock:
    """Correct: adds in SQL, in the batch's transaction."""

    stocked = handler(_stocked)

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"item": event.sku, "n": event.qty})


@_stock_projection("cat-cached-stock")
class CachedStock:
    """Broken: running totals kept in the instance, keyed by source, written whole."""

    stocked = handler(_stocked)

    def __init__(self) -> None:
        self.totals: dict[str, tuple[int, int]] = {}

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        total, count = self.totals.get(event.sku, (0, 0))
        self.totals[event.sku] = (total + event.qty, count + 1)
        ctx.execute(SET, {"item": event.sku, "total": total + event.qty, "count": count + 1})


WAREHOUSE: dict[str, int] = {}
"""Another system the next projection reports stock to."""


@_stock_projection("cat-reported-stock")
class ReportedStock:
    """Broken: reports each addition to another system from the handler, outside the
    transaction (a rolled-back batch has been reported all the same)."""

    stocked = handler(_stocked)

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"item": event.sku, "n": event.qty})
        WAREHOUSE[event.sku] = WAREHOUSE.get(event.sku, 0) + event.qty


@_stock_projection("cat-stamped-stock")
class StampedStock:
    """Correct: stamps each item with when its last addition was recorded."""

    stocked = handler(_stocked)

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"item": event.sku, "n": event.qty})
        ctx.execute(STAMP, {"item": event.sku, "value": repr(ctx.envelope.recorded_at)})


@_stock_projection("cat-clock-stock")
class ClockStock:
    """Broken: stamps each item with the wall clock's time of applying."""

    stocked = handler(_stocked)

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"item": event.sku, "n": event.qty})
        ctx.execute(STAMP, {"item": event.sku, "value": repr(time.time())})


@_stock_projection("cat-receipt-stock")
class ReceiptStock:
    """Correct: the last addition's receipt number is derived from its position."""

    stocked = handler(_stocked)

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"item": event.sku, "n": event.qty})
        ctx.execute(STAMP, {"item": event.sku, "value": f"receipt-{ctx.position}"})


@_stock_projection("cat-random-receipt-stock")
class RandomReceiptStock:
    """Broken: the last addition's receipt number is random."""

    stocked = handler(_stocked)

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"item": event.sku, "n": event.qty})
        ctx.execute(STAMP, {"item": event.sku, "value": uuid.uuid4().hex})


class StockMachine(ClusterMachine):
    """The user's test, as docs/testing.md shows it."""

    consumers: ClassVar[Sequence[type]] = (Stock,)
    initial = [Append(TOPIC, sku, [Stocked(sku)]) for sku in SKUS]
    messages = messages_of(
        Added,
        topic=TOPIC,
        source="sku",
        fields={"sku": st.sampled_from(SKUS), "qty": st.integers(1, 9)},
    )

    def expected(self, messages: Sequence[object]) -> object:
        totals: dict[str, tuple[int, int]] = {}
        for m in messages:
            qty, entries = totals.get(m.sku, (0, 0))  # type: ignore[attr-defined]
            if isinstance(m, Added):
                totals[m.sku] = (qty + m.qty, entries + 1)
            else:
                totals[m.sku] = (qty, entries)  # type: ignore[attr-defined]
        return totals

    def actual(self, conn: Connection) -> object:
        return {r.sku: (r.qty, r.entries) for r in conn.execute(select(stock))}


class StampedMachine(StockMachine):
    """Also compares the stamps, which a replay cannot know: only a rebuild checks them."""

    def actual(self, conn: Connection) -> object:
        return {r.sku: (r.qty, r.entries, r.stamp) for r in conn.execute(select(stock))}

    def expected(self, messages: Sequence[object]) -> object:
        return None


class ReportedMachine(StockMachine):
    def __init__(self, database_url: str | None = None) -> None:
        WAREHOUSE.clear()
        super().__init__(database_url)

    def actual(self, conn: Connection) -> object:
        stock = cast(dict[str, tuple[int, int]], super().actual(conn))
        return {sku: (WAREHOUSE.get(sku, 0), entries) for sku, (_, entries) in stock.items()}


# -- a route consumer -------------------------------------------------------------------------

EMAILS = "cat-emails"


@message("catalogue.send-email")
@attrs.define(frozen=True)
class SendEmail:
    order_id: str


emails = Table(
    "cat_emails",
    metadata,
    Column("order_id", String(64), primary_key=True),
    Column("sent", Integer, nullable=False),
)


def _send(self: object, command: SendEmail, ctx: HandlerContext) -> None:
    """Counts the emails sent per order (read, then write)."""
    row = ctx.connection.execute(
        select(emails.c.sent).where(emails.c.order_id == command.order_id)
    ).scalar_one_or_none()
    if row is None:
        ctx.connection.execute(insert(emails).values(order_id=command.order_id, sent=1))
    else:
        ctx.connection.execute(
            update(emails).where(emails.c.order_id == command.order_id).values(sent=row + 1)
        )


@route_consumer(EMAILS, partitions=4, idempotent=True, tables=[emails])
class GuardedEmails:
    """Correct: the guard skips a message id already handled."""

    send = handler(_send)


@route_consumer(EMAILS, partitions=4, tables=[emails])
class Emails:
    """Broken: no guard, and sending is not idempotent."""

    send = handler(_send)


class EmailsMachine(ClusterMachine):
    consumers: ClassVar[Sequence[type]] = (GuardedEmails,)
    messages = messages_of(
        SendEmail, topic=EMAILS, source="order_id", fields={"order_id": st.sampled_from(SKUS)}
    )

    def expected(self, messages: Sequence[object]) -> object:
        return dict(Counter(m.order_id for m in messages))  # type: ignore[attr-defined]

    def actual(self, conn: Connection) -> object:
        return {r.order_id: r.sent for r in conn.execute(select(emails))}


# -- a saga -----------------------------------------------------------------------------------

ORDERS = "cat-orders"


@message("catalogue.ordered")
@attrs.define(frozen=True)
class Ordered:
    order_id: str
    customer: str


@message("catalogue.remind")
@attrs.define(frozen=True)
class Remind:
    order_id: str


@message("catalogue.reminder")
@attrs.define(frozen=True)
class Reminder:
    order_id: str
    customer: str


@attrs.define
class Order:
    customer: str


@saga("cat-reminders", topics=ORDERS, correlate_by="order_id", state=Order, partitions=4)
class Reminders:
    """Correct: the customer to remind is in the saga's state."""

    @start
    def ordered(self, event: Ordered, ctx: SagaContext) -> None:
        ctx.state = Order(event.customer)
        ctx.schedule(Remind(event.order_id), after=2.0, name="remind")

    @handler
    def remind(self, event: Remind, ctx: SagaContext) -> None:
        ctx.send("cat-reminded", Reminder(ctx.key, ctx.state.customer), key=ctx.key)


@saga("cat-forgetful-reminders", topics=ORDERS, correlate_by="order_id", state=Order, partitions=4)
class ForgetfulReminders:
    """Broken: keeps the customer to remind in the instance until the deadline."""

    def __init__(self) -> None:
        self.customers: dict[str, str] = {}

    @start
    def ordered(self, event: Ordered, ctx: SagaContext) -> None:
        ctx.state = Order("")
        self.customers[event.order_id] = event.customer
        ctx.schedule(Remind(event.order_id), after=2.0, name="remind")

    @handler
    def remind(self, event: Remind, ctx: SagaContext) -> None:
        ctx.send("cat-reminded", Reminder(ctx.key, self.customers[ctx.key]), key=ctx.key)


class RemindersMachine(ClusterMachine):
    consumers: ClassVar[Sequence[type]] = (Reminders,)
    messages = messages_of(
        Ordered,
        topic=ORDERS,
        source="order_id",
        fields={"order_id": st.sampled_from(SKUS), "customer": st.sampled_from(["ada", "bob"])},
    )


# -- a whole flow: a saga, the route consumers it sends to, an external effect ----------------

FLOW = "cat-flow-orders"
WAREHOUSE_DEST, NOTIFY_DEST = "cat-warehouse", "cat-notify"


@message("catalogue.flow-placed")
@attrs.define(frozen=True)
class FlowPlaced:
    order_id: str
    customer: str


@message("catalogue.reserve")
@attrs.define(frozen=True)
class Reserve:
    order_id: str


@message("catalogue.reserved")
@attrs.define(frozen=True)
class Reserved:
    order_id: str


@message("catalogue.expired")
@attrs.define(frozen=True)
class Expired:
    order_id: str


@message("catalogue.notify")
@attrs.define(frozen=True)
class Notify:
    order_id: str
    customer: str
    shipped: bool


@attrs.define
class Fulfilment:
    customer: str


def _notify(ctx: SagaContext, shipped: bool, customer: str) -> None:
    ctx.send(NOTIFY_DEST, Notify(ctx.key, customer, shipped), key=ctx.key)


def _place(ctx: SagaContext, event: FlowPlaced) -> bool:
    """Start the fulfilment of a new order: reserve its stock, expire in 3 s."""
    if ctx.state is not None:
        return False
    ctx.state = Fulfilment(event.customer)
    ctx.send(WAREHOUSE_DEST, Reserve(event.order_id), key=event.order_id)
    ctx.schedule(Expired(event.order_id), after=3.0, name="expire")
    return True


@saga("cat-fulfilment", topics=FLOW, correlate_by="order_id", state=Fulfilment, partitions=4)
class FulfilmentSaga:
    """Correct: the reply ends the order (cancelling its deadline), or the deadline does."""

    @start
    def placed(self, event: FlowPlaced, ctx: SagaContext) -> None:
        _place(ctx, event)

    @handler
    def reserved(self, event: Reserved, ctx: SagaContext) -> None:
        _notify(ctx, True, ctx.state.customer)
        ctx.end()

    @handler
    def expired(self, event: Expired, ctx: SagaContext) -> None:
        _notify(ctx, False, ctx.state.customer)
        ctx.end()


@saga("cat-late-fulfilment", topics=FLOW, correlate_by="order_id", state=Fulfilment, partitions=4)
class LateFulfilment(FulfilmentSaga):
    """Broken: the reply ships the order but leaves the deadline, which cancels it later."""

    @handler
    def reserved(self, event: Reserved, ctx: SagaContext) -> None:
        _notify(ctx, True, ctx.state.customer)


@saga(
    "cat-forgetful-fulfilment", topics=FLOW, correlate_by="order_id", state=Fulfilment, partitions=4
)
class ForgetfulFulfilment(FulfilmentSaga):
    """Broken: keeps the customer to notify in the instance, not in the saga's state."""

    def __init__(self) -> None:
        self.customers: dict[str, str] = {}

    @start
    def placed(self, event: FlowPlaced, ctx: SagaContext) -> None:
        if _place(ctx, event):
            self.customers[event.order_id] = event.customer

    @handler
    def reserved(self, event: Reserved, ctx: SagaContext) -> None:
        _notify(ctx, True, self.customers[ctx.key])
        ctx.end()

    @handler
    def expired(self, event: Expired, ctx: SagaContext) -> None:
        _notify(ctx, False, self.customers[ctx.key])
        ctx.end()


@route_consumer(WAREHOUSE_DEST, partitions=4, idempotent=True)
class Warehouse:
    """Reserves the stock and replies on the order's own partition (its id as source)."""

    @handler
    def reserve(self, command: Reserve, ctx: HandlerContext) -> None:
        ctx.append(FLOW, command.order_id, Reserved(command.order_id))


NOTIFIED: list[tuple[str, str, bool]] = []
"""What an external HTTP endpoint received: (idempotency key, order, shipped), each request."""


def _request(key: str, command: Notify) -> None:
    NOTIFIED.append((key, command.order_id, command.shipped))


@route_consumer(NOTIFY_DEST, partitions=4)
class Notifier:
    """Correct: POSTs each notification with its message id as the idempotency key (a
    batch applied again repeats its requests, with the same keys)."""

    @handler
    def notify(self, command: Notify, ctx: HandlerContext) -> None:
        _request(str(ctx.envelope.message_id), command)


@route_consumer(NOTIFY_DEST, partitions=4)
class RandomKeyNotifier:
    """Broken: a fresh idempotency key per request, so a repeated request is a new one."""

    @handler
    def notify(self, command: Notify, ctx: HandlerContext) -> None:
        _request(uuid.uuid4().hex, command)


class FlowMachine(ClusterMachine):
    """The flow as its team tests it: the endpoint must see at most one notification per
    order, counted by distinct idempotency keys (raw requests repeat after a crash)."""

    consumers: ClassVar[Sequence[type]] = (FulfilmentSaga, Warehouse, Notifier)
    messages = messages_of(
        FlowPlaced,
        topic=FLOW,
        source="order_id",
        fields={"order_id": st.sampled_from(SKUS), "customer": st.sampled_from(["ada", "bob"])},
    )

    def __init__(self, database_url: str | None = None) -> None:
        NOTIFIED.clear()
        super().__init__(database_url)

    @invariant()
    def one_notification_per_order(self) -> None:
        keys: dict[str, set[str]] = {}
        for key, order, _ in NOTIFIED:
            keys.setdefault(order, set()).add(key)
        twice = {order: len(k) for order, k in keys.items() if len(k) > 1}
        assert not twice, f"orders notified more than once (distinct keys): {twice}"


# -- issue 17's user ---------------------------------------------------------------------------

# Issue 17's user, as a test: a small inventory app written only from docs/testing.md (one
# message type ``Added(sku, qty)``, the SKU as the source, 3 SKUs, 4 partitions, no initial
# appends), a correct projection that reads and then updates through ``ctx.connection``,
# and two that keep running totals in the instance's memory and write them whole: one
# that inserts a SKU's row the first time it sees the SKU and updates it afterwards, one
# that upserts. The doc's 20-line test with the defaults, nothing tuned: each broken one
# fails in the battery's handover scenario in seconds, with a sentence (in the catalogue
# below); the correct one passes the battery and the default search.
#
# The insert-then-update one escaped the handover scenario when the source got its message
# once before the move: the fresh instance's first attempt (an insert of a row that
# exists) failed after caching the total, and its retry wrote twice the message, which
# was what a correct consumer writes.

inventory = Table(
    "inv_stock",
    metadata,
    Column("sku", String(64), primary_key=True),
    Column("qty", Integer, nullable=False),
)


@projection("inv-stock", topics=TOPIC, partitions=4, tables=[inventory])
class InventoryStock:
    """Correct: reads the SKU's row, then inserts or updates it, in the batch's transaction."""

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        qty = ctx.connection.execute(
            select(inventory.c.qty).where(inventory.c.sku == event.sku)
        ).scalar_one_or_none()
        if qty is None:
            ctx.connection.execute(insert(inventory).values(sku=event.sku, qty=event.qty))
        else:
            ctx.connection.execute(
                update(inventory).where(inventory.c.sku == event.sku).values(qty=qty + event.qty)
            )


@projection("inv-cached-stock", topics=TOPIC, partitions=4, tables=[inventory])
class CachedInventoryStock:
    """Broken: the running total of each SKU in the instance, inserted the first time this
    instance sees the SKU, updated whole afterwards."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        known = event.sku in self.totals
        self.totals[event.sku] = total = self.totals.get(event.sku, 0) + event.qty
        if known:
            ctx.connection.execute(
                update(inventory).where(inventory.c.sku == event.sku).values(qty=total)
            )
        else:
            ctx.connection.execute(insert(inventory).values(sku=event.sku, qty=total))


@projection("inv-upserted-stock", topics=TOPIC, partitions=4, tables=[inventory])
class UpsertedInventoryStock:
    """Broken: the running total of each SKU in the instance, upserted whole."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    @handler
    def added(self, event: Added, ctx: HandlerContext) -> None:
        self.totals[event.sku] = self.totals.get(event.sku, 0) + event.qty
        ctx.upsert(inventory, {"sku": event.sku}, set={"qty": self.totals[event.sku]})


class InventoryMachine(StockMachine):
    """The user's machine: the same appends, without the initial ones."""

    consumers: ClassVar[Sequence[type]] = (InventoryStock,)
    initial: ClassVar[list[Append]] = []

    def expected(self, messages: Sequence[object]) -> object:
        totals: dict[str, int] = {}
        for m in messages:
            assert isinstance(m, Added)
            totals[m.sku] = totals.get(m.sku, 0) + m.qty
        return totals

    def actual(self, conn: Connection) -> object:
        return {r.sku: r.qty for r in conn.execute(select(inventory))}


# -- the catalogue ----------------------------------------------------------------------------


@attrs.define(frozen=True)
class Entry:
    bug: str
    machine: type[ClusterMachine]
    broken: Sequence[type]
    caught_by: str
    """The start of the failure's message: the scenario that catches it."""
    only: str | None = None
    """Run only this scenario of the battery (an earlier one catches the bug first)."""


def _with(
    machine: type[ClusterMachine], consumers: Sequence[type], only: str | None = None
) -> type[ClusterMachine]:
    """``machine`` with ``consumers`` (and only the battery's scenario ``only``)."""
    battery = {"battery": tuple(s for s in BATTERY if s.name == only)} if only else {}
    return type(
        f"{consumers[0].__name__}Machine", (machine,), {"consumers": tuple(consumers), **battery}
    )


CATALOGUE = [
    Entry("in-memory running totals", StockMachine, [CachedStock], "scenario 'handover'"),
    Entry(
        "writes outside the transaction",
        ReportedMachine,
        [ReportedStock],
        "scenario 'rolled-back batch'",
    ),
    Entry("a handler reading the wall clock", StampedMachine, [ClockStock], "scenario 'rebuild'"),
    Entry("a handler using randomness", StampedMachine, [RandomReceiptStock], "scenario 'rebuild'"),
    Entry("a route consumer without the guard", EmailsMachine, [Emails], "scenario 'sent twice'"),
    Entry(
        "deadline state kept in memory",
        RemindersMachine,
        [ForgetfulReminders],
        "scenario 'deadlines across a takeover'",
    ),
    Entry(
        "a deadline that ignores the reply that came first",
        FlowMachine,
        [LateFulfilment, Warehouse, Notifier],
        "scenario 'handover'",
    ),
    Entry(
        "a flow's saga keeping state in the instance",
        FlowMachine,
        [ForgetfulFulfilment, Warehouse, Notifier],
        "scenario 'deadlines across a takeover'",
    ),
    Entry(
        "a non-idempotent external effect",
        FlowMachine,
        [FulfilmentSaga, Warehouse, RandomKeyNotifier],
        "scenario 'rolled-back batch'",
    ),
    Entry(
        "writes outside the transaction, after a commit of unknown outcome",
        ReportedMachine,
        [ReportedStock],
        "scenario 'lost acknowledgement'",
        only="lost acknowledgement",
    ),
    Entry(
        "in-memory running totals, after a commit of unknown outcome",
        StockMachine,
        [CachedStock],
        "scenario 'lost acknowledgement'",
        only="lost acknowledgement",
    ),
    Entry(
        "writes outside the transaction, by a zombie",
        ReportedMachine,
        [ReportedStock],
        "scenario 'zombie'",
        only="zombie",
    ),
    Entry(
        "writes outside the transaction, by a batch that died before its commit",
        ReportedMachine,
        [ReportedStock],
        "scenario 'crash mid-batch'",
        only="crash mid-batch",
    ),
    Entry(
        "the user's in-memory running totals, inserted at first sight",
        InventoryMachine,
        [CachedInventoryStock],
        "scenario 'handover' failed: the consumer depends on state kept in the instance",
    ),
    Entry(
        "the user's in-memory running totals, upserted",
        InventoryMachine,
        [UpsertedInventoryStock],
        "scenario 'handover' failed: the consumer depends on state kept in the instance",
    ),
]
CORRECT: list[type[ClusterMachine]] = [
    StockMachine,
    _with(StampedMachine, [StampedStock]),
    _with(StampedMachine, [ReceiptStock]),
    EmailsMachine,
    RemindersMachine,
    InventoryMachine,
    FlowMachine,
]


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.bug for e in CATALOGUE])
def test_each_broken_consumer_is_caught_by_the_defaults_in_seconds(
    entry: Entry, run_machine: RunMachine, backend: str
) -> None:
    machine = _with(entry.machine, entry.broken, entry.only)
    started, cpu = time.perf_counter(), time.process_time()
    with pytest.raises(AssertionError) as failure:
        run_machine(machine)
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"\n{entry.bug} on {backend}: caught in {took:.2f} s ({cpu:.2f} s of CPU)")
    report = str(failure.value)
    assert f"the battery's {entry.caught_by}" in report, report
    assert f"state = {machine.__name__}()" in report and "Cluster scenario" in report, report
    # The test's own CPU time: a busy machine (CI's two cores) stretches the wall time.
    assert cpu < CAUGHT_WITHIN, f"{entry.bug}: caught after {cpu:.1f} s of CPU ({took:.1f} s)"


@pytest.mark.parametrize("machine", CORRECT, ids=[m.__name__ for m in CORRECT])
def test_each_correct_consumer_passes_the_battery_and_a_short_search(
    machine: type[ClusterMachine], run_machine: RunMachine
) -> None:
    """The whole battery, and a run of the search (the default search's 25 runs on both
    backends would take minutes here; tests/property runs it in full)."""
    run_machine(machine, machine_settings(max_examples=1))


def test_the_search_alone_finds_state_kept_in_the_instance_and_reports_within_a_minute() -> None:
    """Without the battery, the default search (from scratch: no saved examples) finds
    the cached stock, shrinks it and reports it, program and cluster scenario included,
    within the default report time. (On SQLite only: it takes the whole report time.)"""
    machine = type(
        "SearchedCachedStock", (StockMachine,), {"consumers": (CachedStock,), "battery": ()}
    )
    started = time.perf_counter()
    with pytest.raises(AssertionError, match="read model differs") as failure:
        run_cluster_machine(machine, settings(machine_settings(), database=None))
    took = time.perf_counter() - started
    print(f"\nfound by the search alone and reported in {took:.1f} s")
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    assert "state = SearchedCachedStock()" in notes and "Cluster scenario" in notes, notes
    assert took < REPORTED_WITHIN, f"reported after {took:.1f} s"
    program = notes[notes.index("state = SearchedCachedStock()") : notes.index("state.teardown()")]
    with pytest.raises(AssertionError, match="read model differs"):  # as pasted into a test
        exec(program + "state.teardown()", {**globals(), "SearchedCachedStock": machine})


def test_the_users_correct_inventory_passes_the_defaults() -> None:
    """The whole battery, then the default search (25 runs of 12 steps, from scratch: no
    saved examples), as the user's 20-line test runs them. (On SQLite only: the catalogue's
    correct consumers run the battery and a short search on both backends.)"""
    started = time.perf_counter()
    run_cluster_machine(InventoryMachine, settings(machine_settings(), database=None))
    took = time.perf_counter() - started
    print(f"\nthe user's correct inventory passed the defaults in {took:.1f} s")
