"""An application whose handlers can be held inside their batch by files a test controls
(``GATE_DIR`` in the environment), for real-process tests of slow and frozen owners.

- ``gate-slow`` (declared first) and ``gate-quick``: projections of ``Item`` messages,
  one row per applied message in ``gate_applied`` (its position is the key: a message
  applied twice cannot commit). An ``Item`` with a ``gate`` holds its batch: the handler
  creates ``inside-<gate>`` and waits until ``open-<gate>`` exists.
- ``gate-totals``: a projection of ``Counted`` per key (one row per message in
  ``gate_counted``, a running total per key in ``gate_totals``); ``Freeze`` adds 1000 to
  its key's total, takes that row's lock at once and, in the first process that handles
  it, creates ``frozen-<pid>`` and waits for ``thaw``, holding the lock.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
from sqlalchemy import BigInteger, Column, MetaData, String, Table, bindparam, insert, update

from messaging import HandlerContext, handler, message
from projections import projection

PARTITIONS = 4
metadata = MetaData()
applied = Table(
    "gate_applied",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("consumer", String(40), nullable=False),
)
counted = Table(
    "gate_counted", metadata, Column("position", BigInteger, primary_key=True, autoincrement=False)
)
totals = Table(
    "gate_totals",
    metadata,
    Column("key", String(40), primary_key=True),
    Column("n", BigInteger, nullable=False),
)
ADD = update(totals).where(totals.c.key == bindparam("k")).values(n=totals.c.n + bindparam("d"))


def gate_dir() -> Path:
    return Path(os.environ["GATE_DIR"])


def hold(inside: str, until: str) -> None:
    """Say that the batch is inside (file ``inside``), then wait for file ``until``."""
    (gate_dir() / inside).touch()
    while not (gate_dir() / until).exists():
        time.sleep(0.01)  # the application's own slow work, not a test synchronisation


@message("test.gate.item")
@attrs.define(frozen=True)
class Item:
    gate: str = ""


@message("test.gate.opened")
@attrs.define(frozen=True)
class Opened:
    key: str


@message("test.gate.counted")
@attrs.define(frozen=True)
class Counted:
    key: str


@message("test.gate.freeze")
@attrs.define(frozen=True)
class Freeze:
    key: str


def _apply_item(consumer: str, event: Item, ctx: HandlerContext) -> None:
    ctx.execute(insert(applied), {"position": ctx.envelope.position, "consumer": consumer})
    if event.gate:
        ctx.connection  # noqa: B018  # the row is written (and locked) before the wait
        hold(f"inside-{event.gate}", f"open-{event.gate}")


@projection("gate-slow", topics="gate-slow", partitions=PARTITIONS, tables=[applied])
class Slow:
    @handler
    def item(self, event: Item, ctx: HandlerContext) -> None:
        _apply_item("gate-slow", event, ctx)


@projection("gate-quick", topics="gate-quick", partitions=PARTITIONS, tables=[applied])
class Quick:
    @handler
    def item(self, event: Item, ctx: HandlerContext) -> None:
        _apply_item("gate-quick", event, ctx)


@projection("gate-totals", topics="gate-totals", partitions=6, tables=[counted, totals])
class Totals:
    @handler
    def opened(self, event: Opened, ctx: HandlerContext) -> None:
        ctx.execute(insert(totals), {"key": event.key, "n": 0})

    @handler
    def counted(self, event: Counted, ctx: HandlerContext) -> None:
        ctx.execute(insert(counted), {"position": ctx.envelope.position})
        ctx.execute(ADD, {"k": event.key, "d": 1})

    @handler
    def freeze(self, event: Freeze, ctx: HandlerContext) -> None:
        ctx.execute(ADD, {"k": event.key, "d": 1000})
        ctx.connection  # noqa: B018  # the key's row is locked from here to the commit
        try:
            (gate_dir() / "freezing").open("x").close()  # only the first handler waits
        except FileExistsError:
            return
        hold(f"frozen-{os.getpid()}", "thaw")
