"""What :mod:`shapes_app` and :mod:`shapes_newer_app` share: the topic, the read model's
table and the upcaster splitting a customer's name (no message type is registered here)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table

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

BUGGY: set[str] = set()
"""Order ids :func:`split_customer_name` fails on (a bug a test deploys, then fixes)."""


def split_customer_name(payload: dict[str, Any]) -> dict[str, Any]:
    """Generation 3 split ``customer`` into first and last name."""
    if payload["order_id"] in BUGGY:
        raise ValueError("a bug")
    first, _, last = payload.pop("customer").partition(" ")
    return {**payload, "first_name": first, "last_name": last}
