"""The next generation of :mod:`shapes_app`, as a newer instance of a rolling deploy runs
it: ``shop.sale`` version 3 names the amount ``cents`` (an upcaster from version 2). The
projection is the same declaration (same name, topics, table and handled type name), so
older and newer instances share it. Not importable beside :mod:`shapes_app` (both
register ``shop.sale``): only ``projections run`` processes load it."""

from __future__ import annotations

from typing import Any

import attrs
from shapes_tables import TOPIC, sales, split_customer_name
from sqlalchemy import insert

from messaging import HandlerContext, handler, message, rename, upcaster
from projections import projection


@message("shop.sale", version=3)
@attrs.define(frozen=True)
class Sale:
    order_id: str
    cents: int
    first_name: str
    last_name: str
    currency: str = "EUR"


upcaster("shop.order-placed", 1)(split_customer_name)
rename("shop.order-placed", "shop.sale")


@upcaster("shop.sale", 2)
def to_cents(payload: dict[str, Any]) -> dict[str, Any]:
    """Version 3 names the amount ``cents``."""
    amount = payload.pop("amount")
    return {**payload, "cents": amount}


@projection("shop-sales", topics=TOPIC, partitions=4, tables=[sales])
class Sales:
    @handler
    def sale(self, sale: Sale, ctx: HandlerContext) -> None:
        row = attrs.asdict(sale)
        ctx.execute(insert(sales), {**row, "amount": row.pop("cents")})
