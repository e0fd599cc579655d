"""An application whose one projection's declaration version comes from the environment
(``TALLY_VERSION``), for real-process tests of declaration changes: every message is
recorded with the version of the declaration that applied it."""

from __future__ import annotations

import os

import attrs
from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, insert

from messaging import HandlerContext, handler, message
from projections import projection

VERSION = int(os.environ.get("TALLY_VERSION", "1"))
TOPIC = "tally"
CONSUMER = "tally"

metadata = MetaData()
applied = Table(
    "decl_tally",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),
)


@message("test.tally.counted")
@attrs.define(frozen=True)
class Counted:
    n: int


@projection(CONSUMER, topics=TOPIC, partitions=4, tables=[applied], version=VERSION)
class Tally:
    @handler
    def counted(self, event: Counted, ctx: HandlerContext) -> None:
        ctx.execute(insert(applied), {"position": ctx.envelope.position, "version": VERSION})
