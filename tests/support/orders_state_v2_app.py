"""The next generation of :mod:`orders_state_v1_app`, done right: the state gains a
required field, ``steps_needed`` (how many steps the order takes, a constant of the code
before), so ``state_version=2`` and a ``@state_upcaster`` from version 1 fills it with
what the older code took. Same saga declaration: older and newer instances share it."""

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
    qty: int
    steps: int
    total: int
    trail: str
    steps_needed: int


@state_upcaster(SAGA, 1)
def with_steps_needed(state: dict[str, Any]) -> dict[str, Any]:
    """State version 1 had no ``steps_needed``: every order took :data:`STEPS` steps."""
    return {**state, "steps_needed": STEPS}


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
            ctx.state = Order(event.item, event.qty, 0, 0, "", STEPS)

    @handler
    def step(self, event: OrderStep, ctx: SagaContext) -> None:
        state: Order = ctx.state
        state.steps += 1
        state.total += state.qty * event.n
        state.trail += f"{event.n}."
        if state.steps == state.steps_needed:
            done = OrderDone(event.order_id, state.item, state.total, state.trail, "v2")
            ctx.send(DONE, done, key=event.order_id)
            ctx.end()
