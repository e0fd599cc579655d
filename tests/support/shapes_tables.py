"""What :mod:`shapes_app` and :mod:`shapes_newer_app` share: the topic, the read model's
table, the other message type on the topic and the upcaster splitting a customer's name."""

from __future__ import annotations

from typing import Any

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table

from messaging import message

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
