"""Messages/s of the example balances projection against a hand-written loop, same run.

Run as ``python benchmarks/throughput.py [--messages N] [--mysql-url URL] [--profile]``.

Seeds a fresh database with realistic ledger traffic (accounts opened, deposits,
withdrawals, transfer pairs), then applies it three times with the framework
(``ConsumerWorker.poll()`` of ``projections.examples.ledger.Balances``, batch 500) and
three times with a hand-written ``sqlite3`` loop (resp. PyMySQL) doing the same reads,
read-model writes and checkpoint updates, each run on a fresh copy of the seeded data.
Every run's read model is compared with a sequential ``ledger.replay`` of all messages;
any difference fails the benchmark. Prints the median rate of each and, per backend,
``ratio framework/hand-written: X.XX`` (MySQL first when given, SQLite last).
``--profile`` adds a cProfile summary of one framework run on stderr. ``--tenant T``
runs both as tenant ``T``, whose read model is the copy ``T__ledger_balances`` that the
framework's statements are translated to (``messaging.tenancy``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# Measure this checkout's code, whichever checkout an editable install points at.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sqlalchemy import delete, inspect, select, text

import bench_mysql
import messaging
from messaging import ConsumerSpec, Database, MessageStore, NewMessage
from messaging.declarations import declare
from messaging.membership import InstanceInfo, Membership
from messaging.migrations import migrate
from messaging.ownership import Ownership
from messaging.settings import ConsumerSettings, Distribution
from messaging.tenancy import physical_name
from messaging.worker import ConsumerWorker
from projections.examples import ledger

CONSUMER = "ledger-balances"
SEEDER = "benchmark-seeder"  # declares the consumer; never owns a partition
PARTITIONS = 8  # Balances' partition count; the hand-written loops advance all of them
PARTITION_LIST = ", ".join(str(p) for p in range(PARTITIONS))
BATCH = 500
RUNS = 3
SEED_CHUNK = 10_000
TENANT = "default"
OPENED = messaging.registry.type_name(ledger.AccountOpened)
SIGNS = {
    messaging.registry.type_name(ledger.Deposited): 1,
    messaging.registry.type_name(ledger.Withdrawn): -1,
    messaging.registry.type_name(ledger.TransferSent): -1,
    messaging.registry.type_name(ledger.TransferReceived): 1,
}

Model = dict[str, tuple[str, int, int]]


def balances_name() -> str:
    """The physical name of the balances table for the tenant benchmarked."""
    return physical_name(TENANT, ledger.balances.name)


class BenchmarkFailure(Exception):
    """A run's read model or checkpoints differ from the sequential replay."""


# -- traffic ----------------------------------------------------------------------------


def traffic(count: int, seed: int = 7) -> list[list[NewMessage]]:
    """The example's traffic, encoded, in groups that must commit together (a transfer
    is two), with about one account per 100 messages."""
    encode = messaging.registry.encode
    groups = []
    for command in ledger.traffic(seed, count, accounts=max(4, count // 100)):
        group = []
        for account, event in command:
            type_name, payload = encode(event)
            group.append(
                NewMessage(topic=ledger.TOPIC, source=account, type=type_name, payload=payload)
            )
        groups.append(group)
    return groups


def seed(db: Database, count: int) -> None:
    """Append ``count`` messages in big transactions (transfer pairs never split)."""
    store = MessageStore(db, messaging.registry)
    chunk: list[NewMessage] = []
    for group in traffic(count):
        chunk.extend(group)
        if len(chunk) >= SEED_CHUNK:
            with db.transaction() as conn:
                store.append_encoded(conn, chunk)
            chunk = []
    if chunk:
        with db.transaction() as conn:
            store.append_encoded(conn, chunk)


def expected_model(db: Database) -> tuple[Model, int, int]:
    """Replay of every stored message, decoded by the registry; also the count and last position."""
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(
            select(m.c.position, m.c.type, m.c.payload)
            .where(m.c.tenant == db.tenant, m.c.topic == ledger.TOPIC)
            .order_by(m.c.position)
        ).all()
    decode = messaging.registry.decode
    events = [decode(type_name, payload, position) for position, type_name, payload in rows]
    return ledger.replay(events), len(rows), int(rows[-1][0])


def balances_spec() -> tuple[ConsumerSpec, Any]:
    """The Balances projection's spec, collected through the plugin manager, and the hooks."""
    manager = messaging.create_plugin_manager(["projections.examples.ledger"])
    specs = {spec.name: spec for spec in messaging.collect_consumers(manager)}
    spec = specs[CONSUMER]
    if spec.partitions != PARTITIONS:
        raise BenchmarkFailure(f"{CONSUMER} has {spec.partitions} partitions, not {PARTITIONS}")
    return spec, manager.hook


# -- checks ---------------------------------------------------------------------------


def verify(
    label: str, model: Model, checkpoints: Sequence[int], expected: Model, last: int
) -> None:
    """Fail loudly unless the read model equals the replay and every checkpoint is ``last``."""
    if model != expected:
        missing = sorted(set(expected) - set(model))[:5]
        extra = sorted(set(model) - set(expected))[:5]
        wrong = [a for a in sorted(set(model) & set(expected)) if model[a] != expected[a]][:5]
        raise BenchmarkFailure(
            f"{label}: read model differs from the sequential replay "
            f"({len(model)} vs {len(expected)} accounts; missing {missing}, extra {extra}, "
            f"different {[(a, model[a], expected[a]) for a in wrong]})"
        )
    if len(checkpoints) != PARTITIONS or any(c != last for c in checkpoints):
        raise BenchmarkFailure(f"{label}: checkpoints {list(checkpoints)} are not all {last}")


def framework_state(db: Database) -> tuple[Model, list[int]]:
    """The balances read model and the consumer's checkpoints, read through SQLAlchemy."""
    t = db.schema.partitions
    with db.read() as conn:
        rows = conn.execute(select(db.read_model(ledger.balances))).mappings().all()
        checkpoints = conn.execute(
            select(t.c.checkpoint)
            .where(t.c.tenant == db.tenant, t.c.consumer == CONSUMER)
            .order_by(t.c.partition_no)
        ).scalars()
        return ledger.read_model(rows), [int(c) for c in checkpoints]


# -- the framework ------------------------------------------------------------------------


def framework_run(url: str, spec: ConsumerSpec, hooks: Any, *, table_prefix: str) -> float:
    """Declare, register, claim every partition, then time ``poll()`` until it returns 0."""
    db = Database(url, tenant=TENANT, table_prefix=table_prefix)
    try:
        instance_id = uuid.uuid4().hex
        declare(db, spec, Distribution.PARTITIONED, instance_id)
        membership = Membership(db)
        info = InstanceInfo(
            id=instance_id, name="throughput-bench", host=socket.gethostname(), pid=os.getpid()
        )
        with db.transaction() as conn:
            membership.register(conn, info)
        with db.transaction() as conn:
            claims = Ownership(db).claim(
                conn, spec.name, range(spec.partitions), instance_id, membership.live_ids(30.0)
            )
        if len(claims) != spec.partitions:
            raise BenchmarkFailure(f"claimed {len(claims)} of {spec.partitions} partitions")
        worker = ConsumerWorker(
            db=db,
            spec=spec,
            instance_id=instance_id,
            settings=ConsumerSettings(batch_size=BATCH),
            hooks=hooks,
            registry=messaging.registry,
        )
        worker.add_claims(claims)
        applied = 0
        started = time.perf_counter()
        while True:
            count = worker.poll()
            if count == 0:
                break
            applied += count
        elapsed = time.perf_counter() - started
        return _rate(applied, elapsed, db, "framework")
    finally:
        db.dispose()


def _rate(applied: int, elapsed: float, db: Database, label: str) -> float:
    expected, count, last = EXPECTED[db.url]
    if applied != count:
        raise BenchmarkFailure(f"{label}: applied {applied} messages, expected {count}")
    model, checkpoints = framework_state(db)
    verify(label, model, checkpoints, expected, last)
    return applied / elapsed


EXPECTED: dict[str, tuple[Model, int, int]] = {}
"""Database URL → (replayed model, message count, last position)."""


# -- hand-written loops -----------------------------------------------------------------


def sqlite_hand_written(path: str, *, table_prefix: str) -> float:
    """The loop a person writes with the ``sqlite3`` module; returns messages/s."""
    con = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA foreign_keys=ON")
        cur = con.cursor()
        select_batch = (
            f"SELECT position, type, payload FROM {table_prefix}messages "
            "WHERE tenant = ? AND topic = ? AND position > ? ORDER BY position LIMIT ?"
        )
        balances = balances_name()
        insert_account = (
            f"INSERT INTO {balances} (account_id, owner, balance, entries) VALUES (?, ?, 0, 0)"
        )
        change_balance = (
            f"UPDATE {balances} SET balance = balance + ?, entries = entries + 1 "
            "WHERE account_id = ?"
        )
        checkpoint_update = (
            f"UPDATE {table_prefix}consumer_partitions SET checkpoint = ? "
            f"WHERE tenant = ? AND consumer = ? AND partition_no IN ({PARTITION_LIST})"
        )
        loads = json.loads
        checkpoint = 0
        applied = 0
        started = time.perf_counter()
        while True:
            cur.execute("BEGIN IMMEDIATE")
            rows = cur.execute(select_batch, (TENANT, ledger.TOPIC, checkpoint, BATCH)).fetchall()
            if not rows:
                cur.execute("COMMIT")
                break
            for _position, type_name, payload in rows:
                data = loads(payload)
                if type_name == OPENED:
                    cur.execute(insert_account, (data["account_id"], data["owner"]))
                else:
                    cur.execute(
                        change_balance, (SIGNS[type_name] * data["amount"], data["account_id"])
                    )
            checkpoint = rows[-1][0]
            cur.execute(checkpoint_update, (checkpoint, TENANT, CONSUMER))
            cur.execute("COMMIT")
            applied += len(rows)
        elapsed = time.perf_counter() - started
    finally:
        con.close()
    db = Database(f"sqlite:///{path}", tenant=TENANT, table_prefix=table_prefix)
    try:
        return _rate(applied, elapsed, db, "hand-written sqlite3")
    finally:
        db.dispose()


def mysql_hand_written(url: str, *, table_prefix: str) -> float:
    """The same loop with raw PyMySQL at READ COMMITTED; returns messages/s."""
    con = bench_mysql.connect(url)
    try:
        cur = con.cursor()
        select_batch = (
            f"SELECT position, type, payload FROM {table_prefix}messages "
            "WHERE tenant = %s AND topic = %s AND position > %s ORDER BY position LIMIT %s"
        )
        balances = balances_name()
        insert_account = (
            f"INSERT INTO {balances} (account_id, owner, balance, entries) VALUES (%s, %s, 0, 0)"
        )
        change_balance = (
            f"UPDATE {balances} SET balance = balance + %s, entries = entries + 1 "
            "WHERE account_id = %s"
        )
        checkpoint_update = (
            f"UPDATE {table_prefix}consumer_partitions SET checkpoint = %s "
            f"WHERE tenant = %s AND consumer = %s AND partition_no IN ({PARTITION_LIST})"
        )
        loads = json.loads
        checkpoint = 0
        applied = 0
        started = time.perf_counter()
        while True:
            con.begin()
            cur.execute(select_batch, (TENANT, ledger.TOPIC, checkpoint, BATCH))
            rows = cur.fetchall()
            if not rows:
                con.commit()
                break
            for _position, type_name, payload in rows:
                data = loads(payload)
                if type_name == OPENED:
                    cur.execute(insert_account, (data["account_id"], data["owner"]))
                else:
                    cur.execute(
                        change_balance, (SIGNS[type_name] * data["amount"], data["account_id"])
                    )
            checkpoint = rows[-1][0]
            cur.execute(checkpoint_update, (checkpoint, TENANT, CONSUMER))
            con.commit()
            applied += len(rows)
        elapsed = time.perf_counter() - started
    finally:
        con.close()
    db = Database(url, tenant=TENANT, table_prefix=table_prefix)
    try:
        return _rate(applied, elapsed, db, "hand-written PyMySQL")
    finally:
        db.dispose()


# -- driving ----------------------------------------------------------------------------


def measure(
    label: str,
    count: int,
    fresh: Callable[[], Iterator[str]],
    framework: Callable[[str], float],
    hand_written: Callable[[str], float],
    baseline_name: str,
) -> None:
    """Alternate ``RUNS`` framework and hand-written runs on fresh copies; print medians."""
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(RUNS):
        for target, rates in ((framework, ours), (hand_written, theirs)):
            copies = fresh()
            where = next(copies)
            try:
                rates.append(target(where))
            finally:
                next(copies, None)
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    print(f"{label}: {count} messages, batch {BATCH}, median of {RUNS} runs (results verified)")
    print(f"  framework (ConsumerWorker.poll): {ours_median:>9,.0f} msg/s  runs {_fmt(ours)}")
    baseline = f"hand-written {baseline_name}:"
    print(f"  {baseline:<32} {theirs_median:>9,.0f} msg/s  runs {_fmt(theirs)}")
    print(f"ratio framework/hand-written: {ours_median / theirs_median:.2f}", flush=True)


def _fmt(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:,.0f}" for r in rates)


def profile_framework(run: Callable[[], float]) -> None:
    """One framework run under cProfile; the top 15 functions by own time, on stderr."""
    profiler = cProfile.Profile()
    profiler.enable()
    rate = run()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(15)
    print(
        f"\nprofile of one framework run on SQLite ({rate:,.0f} msg/s under cProfile):",
        file=sys.stderr,
    )
    print(out.getvalue(), file=sys.stderr, flush=True)


def run_sqlite(count: int, profile: bool) -> None:
    """Seed a temp SQLite file once; every run gets its own copy of it."""
    spec, hooks = balances_spec()
    prefix = "prj_"
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        seeded = os.path.join(tmp, "seeded.db")
        url = f"sqlite:///{seeded}"
        db = Database(url, tenant=TENANT, table_prefix=prefix)
        db.prepare()
        seed(db, count)
        declare(db, spec, Distribution.PARTITIONED, SEEDER)
        expected = expected_model(db)
        db.dispose()
        with sqlite3.connect(seeded, isolation_level=None) as con:  # fold the WAL into the file
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        counter = iter(range(1_000_000))

        def fresh() -> Iterator[str]:
            path = os.path.join(tmp, f"run-{next(counter)}.db")
            shutil.copyfile(seeded, path)
            EXPECTED[f"sqlite:///{path}"] = expected
            yield path
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.remove(path + suffix)

        measure(
            "sqlite",
            count,
            fresh,
            lambda path: framework_run(f"sqlite:///{path}", spec, hooks, table_prefix=prefix),
            lambda path: sqlite_hand_written(path, table_prefix=prefix),
            "sqlite3 loop",
        )
        if profile:
            copies = fresh()
            path = next(copies)
            try:
                profile_framework(
                    lambda: framework_run(f"sqlite:///{path}", spec, hooks, table_prefix=prefix)
                )
            finally:
                next(copies, None)


def run_mysql(url: str, count: int) -> None:
    """Seed uniquely prefixed tables once; reset the read model and checkpoints per run."""
    with bench_mysql.scratch_database(url, "throughput") as target:
        _run_mysql(target, count)


def _run_mysql(url: str, count: int) -> None:
    spec, hooks = balances_spec()
    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    db = Database(url, tenant=TENANT, table_prefix=prefix)
    with db.engine.connect() as conn:
        if inspect(conn).has_table(balances_name()):
            db.dispose()
            raise BenchmarkFailure(
                f"table {balances_name()} already exists in {db!r}; "
                "refusing to benchmark over someone else's read model"
            )
    try:
        migrate(db)
        db.prepare()
        seed(db, count)
        EXPECTED[db.url] = expected_model(db)
        t = db.schema

        def fresh() -> Iterator[str]:
            with db.transaction() as conn:
                conn.execute(text(f"DROP TABLE IF EXISTS {balances_name()}"))
                for table in (t.partitions, t.consumers, t.instances):
                    conn.execute(delete(table).where(table.c.tenant == TENANT))
            declare(db, spec, Distribution.PARTITIONED, SEEDER)
            yield db.url

        measure(
            "mysql",
            count,
            fresh,
            lambda target: framework_run(target, spec, hooks, table_prefix=prefix),
            lambda target: mysql_hand_written(target, table_prefix=prefix),
            "PyMySQL loop",
        )
    finally:
        with db.engine.begin() as conn:
            for name in inspect(conn).get_table_names():
                if name.startswith(prefix) or name == balances_name():
                    conn.execute(text(f"DROP TABLE IF EXISTS `{name}`"))
        db.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=None, help="messages (default 100000; 20000 on MySQL)"
    )
    parser.add_argument("--mysql-url", help="also benchmark on MySQL/MariaDB at this URL")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile one framework run (stderr)"
    )
    parser.add_argument(
        "--tenant", default=TENANT, help="the tenant to run as (default: the default tenant)"
    )
    args = parser.parse_args(argv)
    globals()["TENANT"] = args.tenant
    if args.messages is not None and args.messages < 2:
        parser.error("--messages must be at least 2")
    try:
        if args.mysql_url:
            run_mysql(args.mysql_url, args.messages or 20_000)
            print()
        run_sqlite(args.messages or 100_000, args.profile)
    except BenchmarkFailure as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
