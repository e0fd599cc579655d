"""A projection for the parking machines (tests/property/test_parking_machine.py, the kit's
tests/kit/test_parking_kit.py): it records each message of a source with its rank among
the source's applied messages, and fails on a message marked ``poison`` until its (source,
seq) is in :data:`FIXED`."""

from __future__ import annotations

import attrs
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, insert, select

from messaging import HandlerContext, handler, message
from projections import projection

SOURCES = ["s0", "s1", "s2", "s3"]
metadata = MetaData()
applied = Table(
    "test_parking_machine",
    metadata,
    Column("source", String(16), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("rank", Integer, nullable=False),
)
FIXED: set[tuple[str, int]] = set()
"""Poisoned (source, seq) whose handler has been fixed."""


@message("test-parking-machine.step")
@attrs.define(frozen=True)
class Step:
    key: str
    """The source it is appended to."""
    seq: int
    poison: bool = False


@projection("parking-machine", topics="steps", partitions=2, tables=[applied])
class Steps:
    @handler
    def step(self, step: Step, ctx: HandlerContext) -> None:
        source = ctx.envelope.source
        if step.poison and (source, step.seq) not in FIXED:
            raise ValueError(f"{source} #{step.seq} is poison")
        before = ctx.connection.execute(
            select(func.count()).select_from(applied).where(applied.c.source == source)
        ).scalar_one()
        row = {"source": source, "seq": step.seq, "position": ctx.envelope.position}
        ctx.execute(insert(applied), {**row, "rank": before + 1})
