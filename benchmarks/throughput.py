"""Messages/s of the example balances projection against hand-written loops, same run.

Run as ``python benchmarks/throughput.py [--messages N] [--mysql-url URL] [--profile]``.

Seeds a fresh database with realistic ledger traffic (accounts opened, deposits,
withdrawals, transfer pairs), then applies it three times with each of:

- the framework (``ConsumerWorker.poll()`` of ``projections.examples.ledger.Balances``,
  batch 500);
- the **best hand-written loop** for the same read model: one read per batch, the batch's
  changes folded per account in Python and written with one ``executemany`` of an upsert
  (``INSERT … ON CONFLICT DO UPDATE`` with ``sqlite3``; ``INSERT … ON DUPLICATE KEY UPDATE``
  with PyMySQL, which sends it as one multi-row statement), a checkpoint update guarded by
  the checkpoint it replaces (its row count checked), one commit;
- the **mirror loop**, for reference: the framework's own shape by hand (one ``UPDATE``
  per message).

Each run starts from a fresh copy of the seeded data (timed after a garbage collection,
so that no loop pays for the setup before it), and every run's read model and
checkpoints are compared with a sequential ``ledger.replay`` of all messages; any
difference fails the benchmark. Prints the median rate of each and, per backend,
``ratio framework/best hand-written: X.XX`` (MySQL first when given, SQLite last), the
ratio of each interleaved pair and its spread, and each run's CPU µs per message (this
process's CPU time plus the server threads serving it, :mod:`costs`) with their ratio,
which a noisy machine moves far less than the rates; then
``cost per upcast message``: what decoding a payload stored a version earlier, through one
upcaster, costs beyond a current one (the stream above is all current-version messages).
``--profile`` adds a cProfile summary of one framework run on stderr. ``--tenant T``
runs all as tenant ``T``, whose read model is the copy ``T__ledger_balances`` that the
framework's statements are translated to (``messaging.store._tenancy``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
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
from costs import Costs, Server, cpu_ratio, measured, spread
from messaging import Database, MessageStore, NewMessage
from messaging._consumers import ConsumerSpec
from messaging._messages import registry
from messaging._settings import ConsumerGroupSettings, ConsumerSettings, Distribution
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.store._migrations import migrate
from messaging.store._tenancy import physical_name
from messaging.versions._declarations import declare
from projections.examples import ledger

CONSUMER = "ledger-balances"
SEEDER = "benchmark-seeder"  # declares the consumer; never owns a partition
BENCH_INSTANCE = "throughput-bench"  # the instance the framework run registers and logs as
PARTITIONS = 8  # Balances' partition count; the hand-written loops advance all of them
PARTITION_LIST = ", ".join(str(p) for p in range(PARTITIONS))
BATCH = 500
RUNS = 3
SEED_CHUNK = 10_000
TENANT = "default"
OPENED = registry.type_name(ledger.AccountOpened)
SIGNS = {
    registry.type_name(ledger.Deposited): 1,
    registry.type_name(ledger.Withdrawn): -1,
    registry.type_name(ledger.TransferSent): -1,
    registry.type_name(ledger.TransferReceived): 1,
}

Model = dict[str, tuple[str, int, int]]
Run = tuple[float, Costs]
"""Messages/s of one run, and what it cost."""


def balances_name() -> str:
    """The physical name of the balances table for the tenant benchmarked."""
    return physical_name(TENANT, ledger.balances.name)


class BenchmarkFailure(Exception):
    """A run's read model or checkpoints differ from the sequential replay."""


# -- traffic ----------------------------------------------------------------------------


def traffic(count: int, seed: int = 7) -> list[list[NewMessage]]:
    """The example's traffic, encoded, in groups that must commit together (a transfer
    is two), with about one account per 100 messages."""
    encode = registry.encode
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
    store = MessageStore(db, registry)
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
    decode = registry.decode
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


def framework_run(url: str, spec: ConsumerSpec, hooks: Any, *, table_prefix: str) -> Run:
    """Declare, register, claim every partition, then time ``poll()`` until it returns 0."""
    db = Database(url, tenant=TENANT, table_prefix=table_prefix)
    try:
        instance_id = uuid.uuid4().hex
        declare(db, spec, Distribution.PARTITIONED, instance_id, instance_name=BENCH_INSTANCE)
        membership = Membership(db)
        info = InstanceInfo(
            id=instance_id, name=BENCH_INSTANCE, host=socket.gethostname(), pid=os.getpid()
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
            instance_name=BENCH_INSTANCE,
            settings=ConsumerSettings(batch_size=BATCH),
            hooks=hooks,
            registry=registry,
            apply_timeout=ConsumerGroupSettings().apply_timeout,  # as an instance's
        )
        worker.add_claims(claims)
        applied = 0
        server = Server(url)
        gc.collect()  # every loop starts without its setup's garbage pending
        with measured(server) as costs:
            while True:
                count = worker.poll()
                if count == 0:
                    break
                applied += count
        return _rate(applied, costs, db, "framework")
    finally:
        db.dispose()


def _rate(applied: int, costs: Costs, db: Database, label: str) -> Run:
    expected, count, last = EXPECTED[db.url]
    if applied != count:
        raise BenchmarkFailure(f"{label}: applied {applied} messages, expected {count}")
    model, checkpoints = framework_state(db)
    verify(label, model, checkpoints, expected, last)
    costs.count = applied
    return applied / costs.wall, costs


EXPECTED: dict[str, tuple[Model, int, int]] = {}
"""Database URL → (replayed model, message count, last position)."""


# -- hand-written loops -----------------------------------------------------------------

BalanceRow = tuple[str, str, int, int]
"""(account, owner, balance change, entries added) of one account in one batch."""


def fold(rows: Sequence[tuple[Any, ...]]) -> list[BalanceRow]:
    """A batch's changes folded per account, in first-seen order: what the best loop writes.
    An account opened in the batch carries its owner (its opening precedes its changes)."""
    loads = json.loads
    folded: dict[str, list[Any]] = {}
    for _position, type_name, payload in rows:
        data = loads(payload)
        account = data["account_id"]
        row = folded.get(account)
        if row is None:
            row = folded[account] = [account, "", 0, 0]
        if type_name == OPENED:
            row[1] = data["owner"]
        else:
            row[2] += SIGNS[type_name] * data["amount"]
            row[3] += 1
    return [(a, o, b, e) for a, o, b, e in folded.values()]


class Sql:
    """The SQL the loops send, in the driver's parameter style (``?`` or ``%s``)."""

    def __init__(self, table_prefix: str, mark: str) -> None:
        balances = balances_name()
        self.select_batch = (
            f"SELECT position, type, payload FROM {table_prefix}messages "
            f"WHERE tenant = {mark} AND topic = {mark} AND position > {mark} "
            f"ORDER BY position LIMIT {mark}"
        )
        self.insert_account = (
            f"INSERT INTO {balances} (account_id, owner, balance, entries) "
            f"VALUES ({mark}, {mark}, 0, 0)"
        )
        self.change_balance = (
            f"UPDATE {balances} SET balance = balance + {mark}, entries = entries + 1 "
            f"WHERE account_id = {mark}"
        )
        self.upsert = (
            f"INSERT INTO {balances} (account_id, owner, balance, entries) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}) "
            + (
                "ON CONFLICT (account_id) DO UPDATE SET balance = balance + excluded.balance, "
                "entries = entries + excluded.entries"
                if mark == "?"
                # VALUES(), not a row alias: PyMySQL batches only "… VALUES (…) ON DUPLICATE …"
                else "ON DUPLICATE KEY UPDATE "
                "balance = balance + VALUES(balance), entries = entries + VALUES(entries)"
            )
        )
        self.checkpoint = (
            f"UPDATE {table_prefix}consumer_partitions SET checkpoint = {mark} "
            f"WHERE tenant = {mark} AND consumer = {mark} AND partition_no IN ({PARTITION_LIST})"
        )
        self.guarded_checkpoint = f"{self.checkpoint} AND checkpoint = {mark}"


def apply_mirror(cur: Any, sql: Sql, rows: Sequence[tuple[Any, ...]]) -> None:
    """The framework's shape by hand: one statement per message."""
    loads = json.loads
    for _position, type_name, payload in rows:
        data = loads(payload)
        if type_name == OPENED:
            cur.execute(sql.insert_account, (data["account_id"], data["owner"]))
        else:
            cur.execute(sql.change_balance, (SIGNS[type_name] * data["amount"], data["account_id"]))


def commit_guarded(cur: Any, sql: Sql, checkpoint: int, previous: int) -> None:
    """The checkpoint update the best loop sends: it names the checkpoint it replaces."""
    cur.execute(sql.guarded_checkpoint, (checkpoint, TENANT, CONSUMER, previous))
    if cur.rowcount != PARTITIONS:
        raise BenchmarkFailure(f"guarded checkpoint matched {cur.rowcount} rows")


def sqlite_loop(path: str, *, table_prefix: str, best: bool) -> Run:
    """A loop written with the ``sqlite3`` module (the best one, or the mirror); msg/s."""
    con = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA foreign_keys=ON")
        cur = con.cursor()
        sql = Sql(table_prefix, "?")
        checkpoint = 0
        applied = 0
        gc.collect()  # every loop starts without its setup's garbage pending
        with measured(Server(f"sqlite:///{path}")) as costs:
            while True:
                cur.execute("BEGIN IMMEDIATE")
                rows = cur.execute(
                    sql.select_batch, (TENANT, ledger.TOPIC, checkpoint, BATCH)
                ).fetchall()
                if not rows:
                    cur.execute("COMMIT")
                    break
                previous, checkpoint = checkpoint, rows[-1][0]
                if best:
                    cur.executemany(sql.upsert, fold(rows))
                    commit_guarded(cur, sql, checkpoint, previous)
                else:
                    apply_mirror(cur, sql, rows)
                    cur.execute(sql.checkpoint, (checkpoint, TENANT, CONSUMER))
                cur.execute("COMMIT")
                applied += len(rows)
    finally:
        con.close()
    db = Database(f"sqlite:///{path}", tenant=TENANT, table_prefix=table_prefix)
    try:
        return _rate(applied, costs, db, f"sqlite3 {'best' if best else 'mirror'} loop")
    finally:
        db.dispose()


def mysql_loop(url: str, *, table_prefix: str, best: bool) -> Run:
    """The same loops with raw PyMySQL at READ COMMITTED; msg/s."""
    con = bench_mysql.connect(url)
    try:
        cur = con.cursor()
        sql = Sql(table_prefix, "%s")
        checkpoint = 0
        applied = 0
        gc.collect()  # every loop starts without its setup's garbage pending
        server = Server(url)
        with measured(server) as costs:
            while True:
                con.begin()
                cur.execute(sql.select_batch, (TENANT, ledger.TOPIC, checkpoint, BATCH))
                rows = cur.fetchall()
                if not rows:
                    con.commit()
                    break
                previous, checkpoint = checkpoint, rows[-1][0]
                if best:
                    cur.executemany(sql.upsert, fold(rows))  # one multi-row INSERT
                    commit_guarded(cur, sql, checkpoint, previous)
                else:
                    apply_mirror(cur, sql, rows)
                    cur.execute(sql.checkpoint, (checkpoint, TENANT, CONSUMER))
                con.commit()
                applied += len(rows)
    finally:
        con.close()
    db = Database(url, tenant=TENANT, table_prefix=table_prefix)
    try:
        return _rate(applied, costs, db, f"PyMySQL {'best' if best else 'mirror'} loop")
    finally:
        db.dispose()


# -- driving ----------------------------------------------------------------------------


Loop = Callable[[str], Run]
"""Applies every message on the copy it is given; returns messages/s (verified) and its
costs (:mod:`costs`)."""


def measure(
    label: str,
    count: int,
    fresh: Callable[[], Iterator[str]],
    framework: Loop,
    best: tuple[str, Loop],
    mirror: tuple[str, Loop],
) -> None:
    """Alternate ``RUNS`` runs of the framework and the two hand-written loops on fresh
    copies; print the medians and the framework's ratio to the best loop."""
    loops = [("framework (ConsumerWorker.poll)", framework), best, mirror]
    results: list[list[Run]] = [[] for _ in loops]
    for _ in range(RUNS):  # interleaved: a passing load weighs on every loop alike
        for (_name, loop), runs in zip(loops, results, strict=True):
            copies = fresh()
            where = next(copies)
            try:
                runs.append(loop(where))
            finally:
                next(copies, None)
    rates = [[rate for rate, _costs in runs] for runs in results]
    medians = [statistics.median(each) for each in rates]
    print(f"{label}: {count} messages, batch {BATCH}, median of {RUNS} runs (results verified)")
    for (name, _loop), each, median in zip(loops, rates, medians, strict=True):
        print(f"  {name + ':':<40} {median:>9,.0f} msg/s  runs {_fmt(each)}")
    print(f"ratio framework/mirror loop: {medians[0] / medians[2]:.2f}")
    print(f"ratio framework/best hand-written: {medians[0] / medians[1]:.2f}", flush=True)
    pairs = [ours / theirs for ours, theirs in zip(rates[0], rates[1], strict=True)]
    print(f"  per run, framework/best hand-written: {spread(pairs)}")
    ours, theirs = ([c for _rate, c in runs] for runs in results[:2])
    print(cpu_ratio("best hand-written", ours, theirs, "message"), flush=True)


def _fmt(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:,.0f}" for r in rates)


def profile_framework(run: Callable[[], Run]) -> None:
    """One framework run under cProfile; the top 15 functions by own time, on stderr."""
    profiler = cProfile.Profile()
    profiler.enable()
    rate, _costs = run()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumtime").print_stats(45)
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
        declare(db, spec, Distribution.PARTITIONED, SEEDER, instance_name=SEEDER)
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
            (
                "best hand-written sqlite3 (upserts)",
                lambda path: sqlite_loop(path, table_prefix=prefix, best=True),
            ),
            (
                "mirror loop sqlite3 (per message)",
                lambda path: sqlite_loop(path, table_prefix=prefix, best=False),
            ),
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
            declare(db, spec, Distribution.PARTITIONED, SEEDER, instance_name=SEEDER)
            yield db.url

        measure(
            "mysql",
            count,
            fresh,
            lambda target: framework_run(target, spec, hooks, table_prefix=prefix),
            (
                "best hand-written PyMySQL (upserts)",
                lambda target: mysql_loop(target, table_prefix=prefix, best=True),
            ),
            (
                "mirror loop PyMySQL (per message)",
                lambda target: mysql_loop(target, table_prefix=prefix, best=False),
            ),
        )
    finally:
        with db.engine.begin() as conn:
            for name in inspect(conn).get_table_names():
                if name.startswith(prefix) or name == balances_name():
                    conn.execute(text(f"DROP TABLE IF EXISTS `{name}`"))
        db.dispose()


def upcast_cost(count: int) -> tuple[float, float]:
    """Seconds per message to decode a current ``ledger.deposited`` payload with its
    generated decoder, and one stored a version earlier (another field name), taken
    through one upcaster: the cost an old message adds (median of :data:`RUNS`)."""
    from messaging._messages import MessageRegistry

    private = MessageRegistry()  # the ledger's own types stay at version 1
    private.register(ledger.Deposited, "ledger.deposited", 2)

    def rename_amount(payload: dict[str, Any]) -> dict[str, Any]:
        cents = payload.pop("cents")
        return {**payload, "amount": cents}

    private.add_upcaster("ledger.deposited", 1, rename_amount, "ledger.deposited")
    private.check_upcasters()
    current = [json.dumps({"account_id": f"a{i}", "amount": i}) for i in range(count)]
    old = [json.dumps({"account_id": f"a{i}", "cents": i}) for i in range(count)]
    rates = []
    for version, payloads in ((2, current), (1, old)):
        decode = private.reader("ledger.deposited", version)
        runs = []
        for _ in range(RUNS):
            gc.collect()
            started = time.perf_counter()
            for position, payload in enumerate(payloads):
                decode(payload, position)
            runs.append((time.perf_counter() - started) / count)
        rates.append(statistics.median(runs))
    return rates[0], rates[1]


def print_upcast_cost(count: int) -> None:
    current, old = upcast_cost(count)
    print(
        f"cost per upcast message: +{(old - current) * 1e6:.2f} us "
        f"(decode {old * 1e6:.2f} us through one upcaster, {current * 1e6:.2f} us current; "
        "a current-version message pays one list index more in the apply loop)",
        flush=True,
    )


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
        print_upcast_cost(args.messages or 100_000)
    except BenchmarkFailure as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
