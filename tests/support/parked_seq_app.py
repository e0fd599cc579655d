"""A projection for real-process parking tests: it records each message of a source as
(source, seq) once (the primary key refuses a second apply) with its rank among the
source's applied messages, and fails on a message marked ``poison`` while the file named by
``PARKED_SEQ_BROKEN`` exists (deleting it "fixes" the handler). With ``PARKED_SEQ_BLOCK``
set to ``SOURCE:SEQ``, the first time that message is handled the handler creates the file
named by ``PARKED_SEQ_REACHED`` and never returns: the process is inside that message's
transaction until a test kills it. A message of source ``$STUCK_SOURCE`` is stuck
(apply-timeout tests): it writes the time it started to ``$STUCK_STARTED``, then sleeps
``$STUCK_SECONDS`` in Python, or (``$STUCK_SQL`` set) runs a statement that does not end by
itself (``SELECT SLEEP(600)`` on MySQL/MariaDB, an endless recursive query on SQLite)
until something interrupts it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    text,
)

from messaging import Database, HandlerContext, handler, message
from projections import projection

metadata = MetaData()
applied = Table(
    "test_parked_seq",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("position", BigInteger, nullable=False),
    Column("rank", Integer, nullable=False),  # how many of its source were applied before + 1
)


ENDLESS = {
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT count(*) FROM c",
    "mysql": "SELECT SLEEP(600)",
    "mariadb": "SELECT SLEEP(600)",
}


@message("test-parked-seq.step")
@attrs.define(frozen=True)
class Step:
    seq: int
    poison: bool = False


@projection("parked-seq", topics="seq", partitions=4, tables=[applied])
class ParkedSeq:
    @handler
    def step(self, step: Step, ctx: HandlerContext) -> None:
        if step.poison and Path(os.environ["PARKED_SEQ_BROKEN"]).exists():
            raise ValueError(f"step {step.seq} of {ctx.envelope.source} is poison")
        source = ctx.envelope.source
        if source == os.environ.get("STUCK_SOURCE"):
            stuck(ctx)
        if os.environ.get("PARKED_SEQ_BLOCK") == f"{source}:{step.seq}":
            Path(os.environ["PARKED_SEQ_REACHED"]).touch()
            threading.Event().wait()  # inside the transaction, until SIGKILL
        before = ctx.connection.execute(
            select(func.count()).select_from(applied).where(applied.c.source == source)
        ).scalar_one()
        row = {"source": source, "seq": step.seq, "position": ctx.envelope.position}
        ctx.execute(insert(applied), {**row, "rank": before + 1})


def stuck(ctx: HandlerContext) -> None:
    """Take longer than any apply timeout (see the module)."""
    with open(os.environ["STUCK_STARTED"], "a", encoding="utf-8") as out:
        out.write(f"{time.time()}\n")
    if os.environ.get("STUCK_SQL"):
        ctx.connection.execute(text(ENDLESS[ctx.connection.dialect.name])).all()
    else:
        time.sleep(float(os.environ["STUCK_SECONDS"]))


def applied_seqs(db: Database) -> dict[str, list[int]]:
    """Each source's seqs in the order they were applied (by their rank: how many of the
    source were applied before each)."""
    t = applied
    found: dict[str, list[int]] = {}
    with db.read() as conn:
        for row in conn.execute(select(t.c.source, t.c.seq).order_by(t.c.source, t.c.rank)):
            found.setdefault(row.source, []).append(row.seq)
    return found


def applied_within(db: Database, sources: list[str], seqs: list[int], began: float) -> float:
    """Wait until every one of ``sources`` has ``seqs`` applied (in that order); return
    the seconds since ``began`` (a ``time.time()``) by then."""
    deadline = time.monotonic() + 30
    while not all(applied_seqs(db).get(source) == seqs for source in sources):
        assert time.monotonic() < deadline, f"{sources} did not get {seqs} applied in 30 s"
        time.sleep(0.02)
    return time.time() - began
