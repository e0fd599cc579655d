"""A projection for apply-timeout tests: it records each message as (source, seq) once.
A message of source ``$SLOW_SOURCE`` is slow: it writes the time it started to
``$SLOW_STARTED``, then sleeps ``$SLOW_SECONDS`` in Python, or (``$SLOW_SQL`` set) runs a
statement that does not end by itself (``SELECT SLEEP(600)`` on MySQL/MariaDB, an endless
recursive query on SQLite) until something interrupts it."""

from __future__ import annotations

import os
import time

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, text

from messaging import HandlerContext, handler, message
from projections import projection

metadata = MetaData()
applied = Table(
    "test_slow_applied",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
)
ENDLESS = {
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT count(*) FROM c",
    "mysql": "SELECT SLEEP(600)",
    "mariadb": "SELECT SLEEP(600)",
}


@message("test-slow.step")
@attrs.define(frozen=True)
class Step:
    seq: int


@projection("slow-steps", topics="slow", partitions=4, tables=[applied])
class SlowSteps:
    @handler
    def step(self, step: Step, ctx: HandlerContext) -> None:
        source = ctx.envelope.source
        if source == os.environ.get("SLOW_SOURCE"):
            with open(os.environ["SLOW_STARTED"], "a", encoding="utf-8") as out:
                out.write(f"{time.time()}\n")
            if os.environ.get("SLOW_SQL"):
                ctx.connection.execute(text(ENDLESS[ctx.connection.dialect.name])).all()
            else:
                time.sleep(float(os.environ["SLOW_SECONDS"]))
        ctx.execute(insert(applied), {"source": source, "seq": step.seq})
