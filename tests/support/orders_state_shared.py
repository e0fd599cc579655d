"""What the generations of the order-steps saga share (:mod:`orders_state_v1_app`,
:mod:`orders_state_v2_app`, :mod:`orders_state_v2_rename_app`,
:mod:`orders_state_unversioned_app`): its name, topics and messages, and how many steps
an order takes. Each generation changes only the saga's state class.

An order is opened (:class:`OrderOpened`), takes :data:`STEPS` steps (:class:`OrderStep`,
each adding ``qty * n`` to its total and ``n`` to its trail), then ends, sending an
:class:`OrderDone` with what its state added up to and which generation ended it."""

from __future__ import annotations

import attrs

from messaging import message

SAGA = "test-order-steps"
TOPIC = "test-order-steps"
DONE = "test-order-steps-done"
"""The destination each saga instance sends its :class:`OrderDone` to when it ends."""
PARTITIONS = 8
STEPS = 3
"""How many steps an order takes (the first generation's constant)."""


@message("test-order-steps.opened")
@attrs.define(frozen=True)
class OrderOpened:
    order_id: str
    item: str
    qty: int


@message("test-order-steps.step")
@attrs.define(frozen=True)
class OrderStep:
    order_id: str
    n: int


@message("test-order-steps.done")
@attrs.define(frozen=True)
class OrderDone:
    order_id: str
    item: str
    total: int
    trail: str
    by: str
    """The generation of the code that ended the instance."""
