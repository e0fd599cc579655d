"""A saga whose replies race its deadlines, for real-process tests.

Each ``OrderPlaced`` starts a ``fulfilment`` instance: it sends ``ReserveStock`` to the
route consumer ``warehouse`` and schedules ``ReservationExpired`` at a due time carried in
the message itself (deadline rows are deleted at delivery): the order's recorded time plus
``FULFILMENT_DEADLINE`` seconds (default 1) plus up to ``FULFILMENT_DEADLINE_SPREAD``
seconds (default 0), a fraction fixed per order by a hash of its id, so that the due times
of a test's orders fall across the range in which their replies come. The warehouse takes
``FULFILMENT_WAREHOUSE_DELAY`` seconds (default 0.02) per message, a slow side effect, and
appends ``StockReserved`` to the saga's topic with the order as its source: the reply lands
in the instance's partition. Whichever comes first ends the instance with one ``Outcome``
sent to ``outcomes`` (shipped or not), which records it in :data:`outcomes_table`.
"""

from __future__ import annotations

import os
import time
import zlib

import attrs
from sqlalchemy import Boolean, Column, MetaData, String, Table

from messaging import HandlerContext, handler, message, route_consumer
from sagas import SagaContext, saga, start

TOPIC = "orders"
SAGA = "fulfilment"
WAREHOUSE = "warehouse"
OUTCOMES = "outcomes"

DEADLINE = float(os.environ.get("FULFILMENT_DEADLINE", "1.0"))
"""Seconds from an order's recording to the earliest due time of its expiry."""
DEADLINE_SPREAD = float(os.environ.get("FULFILMENT_DEADLINE_SPREAD", "0.0"))
"""Up to this many seconds more, per order (see :func:`due_at`)."""
WAREHOUSE_DELAY = float(os.environ.get("FULFILMENT_WAREHOUSE_DELAY", "0.02"))
"""Seconds the warehouse's side effect takes per message."""

metadata = MetaData()
outcomes_table = Table(
    "test_fulfilment_outcomes",
    metadata,
    Column("order_id", String(64), primary_key=True),
    Column("shipped", Boolean, nullable=False),
    Column("message_id", String(200), nullable=False),
)


@message("test-fulfilment-app.order-placed")
@attrs.define(frozen=True)
class OrderPlaced:
    order_id: str


@message("test-fulfilment-app.reserve-stock")
@attrs.define(frozen=True)
class ReserveStock:
    order_id: str


@message("test-fulfilment-app.stock-reserved")
@attrs.define(frozen=True)
class StockReserved:
    order_id: str


@message("test-fulfilment-app.reservation-expired")
@attrs.define(frozen=True)
class ReservationExpired:
    order_id: str
    due_at: float
    """When it was due (epoch seconds, the database's clock)."""


@message("test-fulfilment-app.outcome")
@attrs.define(frozen=True)
class Outcome:
    order_id: str
    shipped: bool


@attrs.define
class Fulfilment:
    due_at: float


def due_at(order_id: str, placed_at: float) -> float:
    """When the reservation of ``order_id``, placed (recorded) at ``placed_at``, expires:
    :data:`DEADLINE` plus a fraction of :data:`DEADLINE_SPREAD` fixed by the order's id."""
    fraction = zlib.crc32(order_id.encode()) % 1000 / 1000
    return placed_at + DEADLINE + DEADLINE_SPREAD * fraction


@saga(SAGA, topics=TOPIC, correlate_by="order_id", state=Fulfilment, partitions=8)
class Fulfilments:
    @start
    def placed(self, event: OrderPlaced, ctx: SagaContext) -> None:
        due = due_at(event.order_id, ctx.envelope.recorded_at)
        ctx.state = Fulfilment(due)
        ctx.send(WAREHOUSE, ReserveStock(event.order_id), key=event.order_id)
        ctx.schedule(ReservationExpired(event.order_id, due), at=due)

    @handler
    def reserved(self, event: StockReserved, ctx: SagaContext) -> None:
        ctx.send(OUTCOMES, Outcome(ctx.key, shipped=True), key=ctx.key)
        ctx.end()

    @handler
    def expired(self, event: ReservationExpired, ctx: SagaContext) -> None:
        ctx.send(OUTCOMES, Outcome(ctx.key, shipped=False), key=ctx.key)
        ctx.end()


@route_consumer(WAREHOUSE, partitions=8, idempotent=True)
class Warehouse:
    @handler
    def reserve(self, command: ReserveStock, ctx: HandlerContext) -> None:
        time.sleep(WAREHOUSE_DELAY)  # the slow side effect
        ctx.append(TOPIC, command.order_id, StockReserved(command.order_id))


@route_consumer(OUTCOMES, partitions=4, idempotent=True, tables=[outcomes_table])
class Outcomes:
    @handler
    def record(self, outcome: Outcome, ctx: HandlerContext) -> None:
        ctx.upsert(
            outcomes_table,
            {"order_id": outcome.order_id},
            set={"shipped": outcome.shipped, "message_id": ctx.envelope.message_id or ""},
        )
