"""A message class that changed shape over three generations, and consumers of it.

- generation 1: ``shop.order-placed`` version 1, ``{order_id, amount, customer}``;
- generation 2: a field added with a default (``currency``, "EUR"): still version 1, old
  payloads fit the class as they are;
- generation 3: ``customer`` split into ``first_name`` and ``last_name``: version 2, with
  an upcaster from version 1;
- now: the type renamed ``shop.sale`` (still version 2): a rename.

:func:`write_generations` stores what each generation wrote, raw, as its code did;
:data:`EXPECTED` is what the current class makes of each.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from shapes_tables import TOPIC, metadata, sales, split_customer_name
from sqlalchemy import Column, String, Table, insert

from messaging import (
    Database,
    HandlerContext,
    MessageStore,
    NewMessage,
    handler,
    message,
    rename,
    route_consumer,
    upcaster,
)
from projections import projection
from sagas import SagaContext, saga, start, state_upcaster


@message("shop.sale", version=2)
@attrs.define(frozen=True)
class Sale:
    order_id: str
    amount: int
    first_name: str
    last_name: str
    currency: str = "EUR"


split_customer = upcaster("shop.order-placed", 1)(split_customer_name)
rename("shop.order-placed", "shop.sale")


@projection("shop-sales", topics=TOPIC, partitions=4, tables=[sales])
class Sales:
    @handler
    def sale(self, sale: Sale, ctx: HandlerContext) -> None:
        ctx.execute(insert(sales), attrs.asdict(sale))


GENERATIONS: list[tuple[str, int, dict[str, Any]]] = [
    ("shop.order-placed", 1, {"order_id": "o1", "amount": 10, "customer": "Ada Lovelace"}),
    (
        "shop.order-placed",
        1,
        {"order_id": "o2", "amount": 20, "customer": "Alan Turing", "currency": "GBP"},
    ),
    (
        "shop.order-placed",
        2,
        {
            "order_id": "o3",
            "amount": 30,
            "first_name": "Grace",
            "last_name": "Hopper",
            "currency": "USD",
        },
    ),
    (
        "shop.sale",
        2,
        {
            "order_id": "o4",
            "amount": 40,
            "first_name": "Edsger",
            "last_name": "Dijkstra",
            "currency": "EUR",
        },
    ),
]
"""(type, payload version, payload) as each generation stored them."""

EXPECTED = [
    Sale("o1", 10, "Ada", "Lovelace", "EUR"),
    Sale("o2", 20, "Alan", "Turing", "GBP"),
    Sale("o3", 30, "Grace", "Hopper", "USD"),
    Sale("o4", 40, "Edsger", "Dijkstra", "EUR"),
]
"""What the current class makes of :data:`GENERATIONS`, in order."""


def write_generations(
    db: Database, *, times: int = 1, notes: bool = True, first: int = 0
) -> list[int]:
    """Append :data:`GENERATIONS` (``times`` over from round ``first``, order ids suffixed by
    the round after round 0), each with a note between; return the positions of the sales."""
    rows = []
    for round_ in range(first, first + times):
        for type_name, version, payload in GENERATIONS:
            order = payload["order_id"] + (f"-{round_}" if round_ else "")
            body = json.dumps({**payload, "order_id": order})
            rows.append(
                NewMessage(
                    topic=TOPIC, source=order, type=type_name, payload=body, payload_version=version
                )
            )
            if notes:
                rows.append(
                    NewMessage(topic=TOPIC, source=order, type="shop.note", payload='{"text":"n"}')
                )
    with db.transaction() as conn:
        positions = MessageStore(db).append_encoded(conn, rows)
    return [p for p, row in zip(positions, rows, strict=True) if row.type != "shop.note"]


invoices = Table(
    "test_shape_invoices",
    metadata,
    Column("order_id", String(64), primary_key=True),
    Column("billed", String(200), nullable=False),
)
INVOICES = "shop-invoices"
"""The route consumer's destination: sales sent to it are billed."""


@route_consumer(INVOICES, partitions=2, idempotent=True, tables=[invoices])
class Invoices:
    @handler
    def bill(self, sale: Sale, ctx: HandlerContext) -> None:
        billed = f"{sale.first_name} {sale.last_name}: {sale.amount} {sale.currency}"
        ctx.execute(insert(invoices), {"order_id": sale.order_id, "billed": billed})


@attrs.define
class Customer:
    name: str
    spent: int = 0


@saga("shop-customers", topics=TOPIC, correlate_by="order_id", state=Customer, partitions=4)
class Customers:
    @start
    def sale(self, sale: Sale, ctx: SagaContext) -> None:
        ctx.state = Customer(f"{sale.first_name} {sale.last_name}", sale.amount)


def send_generations(db: Database) -> None:
    """Send :data:`GENERATIONS` to the route consumer, raw, as each generation did."""
    rows = [
        NewMessage(
            topic=INVOICES,
            source=payload["order_id"],
            type=type_name,
            payload=json.dumps(payload),
            headers={"message-id": f"m-{payload['order_id']}"},
            payload_version=version,
        )
        for type_name, version, payload in GENERATIONS
    ]
    with db.transaction() as conn:
        MessageStore(db).append_encoded(conn, rows)


@attrs.define
class Points:
    """The loyalty saga's state, version 2; version 1 was ``{"name", "score"}``."""

    customer: str
    points: int


@state_upcaster("shop-loyalty", 1)
def rename_score(state: dict[str, Any]) -> dict[str, Any]:
    return {"customer": state["name"], "points": state["score"]}


@saga(
    "shop-loyalty",
    topics=TOPIC,
    correlate_by="order_id",
    state=Points,
    state_version=2,
    partitions=4,
)
class Loyalty:
    """Adds each sale's amount to its order's points."""

    @start
    def sale(self, sale: Sale, ctx: SagaContext) -> None:
        state = ctx.state or Points(f"{sale.first_name} {sale.last_name}", 0)
        ctx.state = Points(state.customer, state.points + sale.amount)
