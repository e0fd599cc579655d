"""Another next generation of :mod:`orders_state_v1_app`, done right: the state's ``qty``
is renamed ``quantity``, so ``state_version=2`` and a ``@state_upcaster`` from version 1
moves it. Same saga declaration: older and newer instances share it."""

from __future__ import annotations

from typing import Any

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
from sagas import SagaContext, saga, start, state_upcaster


@attrs.define
class Order:
    item: str
    quantity: int
    steps: int
    total: int
    trail: str


@state_upcaster(SAGA, 1)
def rename_qty(state: dict[str, Any]) -> dict[str, Any]:
    """State version 1 named the quantity ``qty``."""
    moved = dict(state)
    moved["quantity"] = moved.pop("qty")
    return moved


@saga(
    SAGA,
    topics=TOPIC,
    correlate_by="order_id",
    state=Order,
    state_version=2,
    partitions=PARTITIONS,
)
class OrderSteps:
    @start
    def opened(self, event: OrderOpened, ctx: SagaContext) -> None:
        if ctx.state is None:
            ctx.state = Order(event.item, event.qty, 0, 0, "")

    @handler
    def step(self, event: OrderStep, ctx: SagaContext) -> None:
        state: Order = ctx.state
        state.steps += 1
        state.total += state.quantity * event.n
        state.trail += f"{event.n}."
        if state.steps == STEPS:
            done = OrderDone(event.order_id, state.item, state.total, state.trail, "v2-rename")
            ctx.send(DONE, done, key=event.order_id)
            ctx.end()
