"""The change of :mod:`orders_state_v2_app` made wrongly: the state gains the required
field ``steps_needed`` but the saga stays at state version 1, with no upcaster. A state the
older code stored (no ``steps_needed``) cannot be read by this code, nor one this code stores
by the older code (a field it does not know): each halts its partition, naming the field
and the fix (``sagas.UnreadableState``)."""

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
    steps_needed: int


@saga(SAGA, topics=TOPIC, correlate_by="order_id", state=Order, partitions=PARTITIONS)
class OrderSteps:
    @start
    def opened(self, event: OrderOpened, ctx: SagaContext) -> None:
        if ctx.state is None:
            ctx.state = Order(event.item, event.qty, 0, 0, "", STEPS)

    @handler
    def step(self, event: OrderStep, ctx: SagaContext) -> None:
        state: Order = ctx.state
        state.steps += 1
        state.total += state.qty * event.n
        state.trail += f"{event.n}."
        if state.steps == state.steps_needed:
            done = OrderDone(event.order_id, state.item, state.total, state.trail, "unversioned")
            ctx.send(DONE, done, key=event.order_id)
            ctx.end()
