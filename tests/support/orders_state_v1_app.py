"""The order-steps saga as the older instances of a rolling deploy run it: its state at
state version 1, ``{item, qty, steps, total, trail}``, and :data:`STEPS` steps an order.
Not importable beside the newer generations (the same saga and state name): only
``projections run`` processes load them."""

from __future__ import annotations

import attrs
from orders_state_shared import (
    DONE,
    PARTITIONS,
    SAGA,
    STEPS,
    TOPIC,
    OrderDone,
    OrderOpened,
    OrderStep,
)

from messaging import handler
from sagas import SagaContext, saga, start


@attrs.define
class Order:
    item: str
    qty: int
    steps: int
    total: int
    trail: str


@saga(SAGA, topics=TOPIC, correlate_by="order_id", state=Order, partitions=PARTITIONS)
class OrderSteps:
    @start
    def opened(self, event: OrderOpened, ctx: SagaContext) -> None:
        if ctx.state is None:
            ctx.state = Order(event.item, event.qty, 0, 0, "")

    @handler
    def step(self, event: OrderStep, ctx: SagaContext) -> None:
        state: Order = ctx.state
        state.steps += 1
        state.total += state.qty * event.n
        state.trail += f"{event.n}."
        if state.steps == STEPS:
            done = OrderDone(event.order_id, state.item, state.total, state.trail, "v1")
            ctx.send(DONE, done, key=event.order_id)
            ctx.end()
