"""An application for the health tests: one projection whose messages say how their
handler fares: applied (``ok``), failing for ever (``poison``: the partition halts),
sleeping a while first (``slow``: after creating ``$HEALTH_DIR/slow-<pid>``), or ending
the thread that applies it (``fatal``: ``SystemExit``, as a loop that dies)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
from sqlalchemy import BigInteger, Column, MetaData, Table, insert

from messaging import HandlerContext, MessageStore, handler, message
from messaging.store._database import Database
from projections import projection

TOPIC = "health"
CONSUMER = "health-tally"
SLOW_SECONDS = 3.0

metadata = MetaData()
applied = Table(
    "health_tally", metadata, Column("position", BigInteger, primary_key=True, autoincrement=False)
)


@message("test.health.counted")
@attrs.define(frozen=True)
class Counted:
    n: int
    fate: str = "ok"


@projection(CONSUMER, topics=TOPIC, partitions=4, tables=[applied])
class HealthTally:
    @handler
    def counted(self, event: Counted, ctx: HandlerContext) -> None:
        if event.fate == "poison":
            raise ValueError(f"message {event.n} is poison")
        if event.fate == "fatal":
            raise SystemExit(f"message {event.n} ends its loop")
        if event.fate == "slow":
            (Path(os.environ["HEALTH_DIR"]) / f"slow-{os.getpid()}").touch()
            time.sleep(SLOW_SECONDS)
        ctx.execute(insert(applied), {"position": ctx.envelope.position})


def append(db: Database, first: int, count: int, fate: str = "ok") -> None:
    """Append ``count`` messages numbered from ``first``, each of its own source (so they
    spread over the partitions), all with ``fate``."""
    store = MessageStore(db)
    with db.transaction() as conn:
        for n in range(first, first + count):
            store.append(conn, TOPIC, f"s{n}", [Counted(n, fate)])
