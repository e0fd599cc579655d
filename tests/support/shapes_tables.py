"""What :mod:`shapes_app` and :mod:`shapes_newer_app` share: the topic, the read model's
table, the other message type on the topic and the upcaster splitting a customer's name."""

from __future__ import annotations

import json
from typing import Any

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select

from messaging import Database, NewMessage, message

TOPIC = "shop"

metadata = MetaData()
sales = Table(
    "test_shape_sales",
    metadata,
    Column("order_id", String(64), primary_key=True),
    Column("amount", Integer, nullable=False),
    Column("currency", String(8), nullable=False),
    Column("first_name", String(64), nullable=False),
    Column("last_name", String(64), nullable=False),
)


@message("shop.note")
@attrs.define(frozen=True)
class Note:
    """Another type on the topic, which the projection does not handle."""

    text: str


BUGGY: set[str] = set()
"""Order ids :func:`split_customer_name` fails on (a bug a test deploys, then fixes)."""


def split_customer_name(payload: dict[str, Any]) -> dict[str, Any]:
    """Generation 3 split ``customer`` into first and last name."""
    if payload["order_id"] in BUGGY:
        raise ValueError("a bug")
    first, _, last = payload.pop("customer").partition(" ")
    return {**payload, "first_name": first, "last_name": last}


def newer_sales(count: int, first: int = 0) -> list[NewMessage]:
    """What the newer instances' producers write (:mod:`shapes_newer_app`): ``shop.sale``
    version 3 with the amount in ``cents``, one source per sale (``n<i>``, ``cents``
    100 + i)."""
    return [
        NewMessage(
            topic=TOPIC,
            source=f"n{i}",
            type="shop.sale",
            payload=json.dumps(
                {"order_id": f"n{i}", "cents": 100 + i, "first_name": "N", "last_name": f"{i}"}
            ),
            payload_version=3,
        )
        for i in range(first, first + count)
    ]


def sales_count(db: Database) -> int:
    """How many sales the read model holds."""
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(sales)).scalar_one())
