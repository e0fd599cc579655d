"""The cost of a parked source to the others, and of parking when nothing is parked.

Run as ``python benchmarks/parking.py [--sources N] [--per-source K] [--mysql-url URL]``.

One partition, ``N`` sources with ``K`` messages each (interleaved), applied by a
projection with ``on-failure: park-source`` (batch 500), five runs each (interleaved) of:

- **clean**: no poison;
- **poisoned**: the first message of one source fails (it and its later messages are
  parked; every other source's messages are applied).

Prints the median rate of the other sources' messages in each, and
``ratio poisoned/clean: X.XX`` (the issue's target: at least 0.95), also per second of
the process's CPU. It also counts the
statements sent with parking on and off, nothing parked (they must be equal; on MySQL
those a cursor listener sees). Every run's read model is checked: every message of the
other sources once, none of the poisoned one's.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# Measure this checkout's code, whichever checkout an editable install points at.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table, event, select

import bench_mysql
from messaging import Database, HandlerContext, MessageStore, Settings, handler, message
from messaging._consumers import consumer_spec
from messaging._messages import registry
from messaging._plugins import create_plugin_manager
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.failures._parking import Parking
from messaging.store._migrations import migrate
from projections import projection

POISONED = "source-0"
metadata = MetaData()
counts = Table(
    "bench_parking_counts",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("seen", Integer, nullable=False),
)


@message("bench-parking.step")
@attrs.define(frozen=True)
class Step:
    n: int
    poison: bool = False


@projection("bench-parking", topics="steps", partitions=1, tables=[counts])
class Counts:
    @handler
    def step(self, step: Step, ctx: HandlerContext) -> None:
        if step.poison:
            raise ValueError("poison")
        ctx.upsert(counts, {"source": ctx.envelope.source}, set={}, add={"seen": 1})


_RUNS = iter(range(1_000_000))


def _prepare(url: str, sources: int, per_source: int, poison: bool) -> Database:
    """A fresh store (a table prefix of its own) holding the messages."""
    db = Database(url, table_prefix=f"bp{next(_RUNS)}_")
    if not db.is_sqlite:
        migrate(db)
    db.prepare()
    with db.transaction() as conn:
        metadata.drop_all(conn)
        metadata.create_all(conn)
    store = MessageStore(db)
    for k in range(per_source):
        with db.transaction() as conn:
            for s in range(sources):
                source = f"source-{s}"
                bad = poison and source == POISONED and k == 0
                store.append(conn, "steps", source, [Step(k, bad)])
    return db


def _worker(db: Database, parking: bool) -> ConsumerWorker:
    worker = ConsumerWorker(
        db=db,
        spec=consumer_spec(Counts),
        instance_id="bench",
        instance_name="bench",
        settings=Settings().messaging.consumer,
        hooks=create_plugin_manager([], load_entrypoints=False).hook,
        registry=registry,
        parking=Parking(db, "bench-parking", 100) if parking else None,
    )
    ownership = Ownership(db)
    with db.transaction() as conn:
        Membership(db).register(conn, InstanceInfo(id="bench", name="bench", host="h", pid=1))
        ownership.ensure_partitions(conn, "bench-parking", 1)
        claims = ownership.claim(conn, "bench-parking", [0], "bench", Membership(db).live_ids(30))
    worker.add_claims(claims)
    return worker


def _run(url: str, sources: int, per_source: int, poison: bool) -> tuple[float, float]:
    """Messages of the other sources applied per second, and per second of this process's
    CPU (less sensitive to a loaded machine; on MySQL the server's work is not in it)."""
    db = _prepare(url, sources, per_source, poison)
    try:
        worker = _worker(db, parking=True)
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        while worker.poll():
            pass
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        with db.read() as conn:
            seen = {r[0]: r[1] for r in conn.execute(select(counts.c.source, counts.c.seen))}
        expected = {f"source-{s}": per_source for s in range(sources)}
        if poison:
            del expected[POISONED]
        if seen != expected:
            raise SystemExit(f"wrong read model ({len(seen)} sources seen)")
    finally:
        db.dispose()
    applied = (sources - 1) * per_source
    return applied / seconds, applied / cpu


def _statements(url: str, parking: bool, sources: int) -> list[str]:
    """The first word of every statement sent while the messages are applied (on MySQL,
    those sent through a cursor: what a listener there sees, the same with parking on
    and off)."""
    db = _prepare(url, sources, 2, poison=False)
    sent: list[str] = []
    try:
        worker = _worker(db, parking)
        db.engine.dispose()
        if db.is_sqlite:
            event.listen(db.engine, "connect", lambda c, _r: c.set_trace_callback(sent.append))
        else:
            event.listen(db.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
        while worker.poll():
            pass
    finally:
        db.dispose()
    return [statement.split()[0] for statement in sent]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=10_000)
    parser.add_argument("--per-source", type=int, default=2)
    parser.add_argument("--mysql-url", help="also benchmark on MySQL/MariaDB at this URL")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        if args.mysql_url:
            with bench_mysql.scratch_database(args.mysql_url, "parking") as target:
                _measure("mysql", target, target, target, args)
        url = f"sqlite:///{folder}/parking.db"
        _measure("sqlite", url, f"sqlite:///{folder}/on.db", f"sqlite:///{folder}/off.db", args)
    return 0


def _measure(name: str, url: str, on_url: str, off_url: str, args: argparse.Namespace) -> None:
    rates: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(5):
        for poison in (False, True):
            rates[poison].append(_run(url, args.sources, args.per_source, poison))
    for i, what in enumerate(("", " of CPU")):
        clean = statistics.median(r[i] for r in rates[False])
        poisoned = statistics.median(r[i] for r in rates[True])
        print(
            f"{name}: clean {clean:,.0f} msg/s{what}, poisoned {poisoned:,.0f} msg/s{what} "
            f"(other sources); ratio poisoned/clean{what}: {poisoned / clean:.2f}"
        )
    on = _statements(on_url, True, args.sources)
    off = _statements(off_url, False, args.sources)
    print(f"{name}: statements with parking on/off, nothing parked: {len(on)}/{len(off)}")
    if on != off:
        raise SystemExit("parking costs statements while nothing is parked")


if __name__ == "__main__":
    sys.exit(main())
