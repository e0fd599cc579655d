"""A deadline never overtakes a message recorded before it fell due, even one whose append
has not committed yet when the delivery starts: the delivery waits for the append
holding the tenant's position counter (MySQL's locking read of it), then sees the
message and holds the deadline back. (On SQLite the delivery's write transaction waits
for the append's by construction: one write lock.)"""

from __future__ import annotations

import json
import threading
import time
from contextlib import ExitStack

import attrs
from clusters import manual_clock_database
from sqlalchemy import text

from messaging import MessageStore, handler, message, route_consumer
from messaging._config import settings_from_mapping
from messaging.applying._context import HandlerContext
from projections.testing import SimulatedCluster
from sagas import SagaContext, saga, start

SETTINGS = settings_from_mapping({"messaging": {"consumer": {"batch-size": 50}}})
TIMEOUT = 10.0


@message("test-behind.placed")
@attrs.define(frozen=True)
class Placed:
    order_id: str


@message("test-behind.reserved")
@attrs.define(frozen=True)
class Reserved:
    order_id: str


@message("test-behind.expired")
@attrs.define(frozen=True)
class Expired:
    order_id: str


@message("test-behind.outcome")
@attrs.define(frozen=True)
class Outcome:
    order_id: str
    shipped: bool


@attrs.define
class Order:
    reserved: bool = False


@saga("test-behind-orders", topics="behind-orders", correlate_by="order_id", state=Order)
class Orders:
    @start
    def placed(self, event: Placed, ctx: SagaContext) -> None:
        ctx.state = Order()
        ctx.schedule(Expired(event.order_id), after=TIMEOUT)

    @handler
    def reserved(self, event: Reserved, ctx: SagaContext) -> None:
        ctx.send("test-behind-outcomes", Outcome(ctx.key, shipped=True), key=ctx.key)
        ctx.end()

    @handler
    def expired(self, event: Expired, ctx: SagaContext) -> None:
        ctx.send("test-behind-outcomes", Outcome(ctx.key, shipped=False), key=ctx.key)
        ctx.end()


@route_consumer("test-behind-outcomes")
class Outcomes:
    @handler
    def outcome(self, command: Outcome, ctx: HandlerContext) -> None:
        pass


def _waiting_on_the_counter(cluster: SimulatedCluster) -> bool:
    """Whether another session's statement on the position counter is running (waiting for
    the lock the test's open append holds)."""
    positions = cluster.db.schema.positions.name
    with cluster.db.read() as conn:
        running = conn.execute(
            text(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                " WHERE id != CONNECTION_ID() AND info LIKE :table"
            ),
            {"table": f"%{positions}%"},
        ).scalar_one()
    return bool(running)


def _shipped(cluster: SimulatedCluster) -> list[bool]:
    """What the saga told ``test-behind-outcomes``, in order: shipped or not."""
    with cluster.db.read() as conn:
        rows = MessageStore(cluster.db).read(conn, ["test-behind-outcomes"], limit=100)
    return [json.loads(row.payload)["shipped"] for row in rows]


def test_a_delivery_waits_for_an_append_in_flight_recorded_before_the_due_time(
    database_url: str, table_prefix: str
) -> None:
    cluster = SimulatedCluster(
        manual_clock_database(database_url, table_prefix), [Orders, Outcomes], SETTINGS
    )
    worker = cluster.join("a").workers["test-behind-orders"]
    store = MessageStore(cluster.db)
    with cluster.db.transaction() as conn:
        store.append(conn, "behind-orders", "o-1", [Placed("o-1")])
    while cluster.poll_all():
        pass
    cluster.clock.advance(TIMEOUT - 0.5)
    with ExitStack() as open_append:
        conn = open_append.enter_context(cluster.db.transaction())
        store.append(conn, "behind-orders", "o-1", [Reserved("o-1")])  # recorded, not committed
        cluster.clock.advance(1.0)  # the deadline falls due
        polled = threading.Thread(target=worker.poll)
        polled.start()
        waited = time.monotonic() + 30
        while not _waiting_on_the_counter(cluster):  # the delivery waits for this append
            assert polled.is_alive() and time.monotonic() < waited, "the delivery did not wait"
            time.sleep(0.01)
    polled.join(30)
    assert not polled.is_alive()
    while cluster.poll_all():
        pass
    assert _shipped(cluster) == [True]  # the reply first: no expiry
