"""Rebuilds without downtime: a large ledger rebuilt with appends flowing, every answer of
a reader checked against the replay of what it can see.

Run as ``python benchmarks/rebuild.py [--mysql-url URL] [--messages N] [--probes N]``.

Per backend (SQLite in a temporary file; MySQL/MariaDB in a scratch database beside the
given one): N ledger messages (1,000,000 by default, about one account per 100) are
appended while no instance runs; two ``projections run`` processes of the ledger app start
at the default settings and apply them: the **steady apply rate** is N over the time from
their first claim to the batch completing N (stamped by ``handover.py``'s probe plugin).
A **reader** process then opens, every 10 ms, one consistent-snapshot read transaction
(MySQL: ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`` at REPEATABLE READ;
SQLite: ``BEGIN``, WAL) reading the read model the documented way, by its declared name
(``SELECT count(*), sum(entries), sum(balance) FROM ledger_balances``), and the
checkpoints of every partition of ``ledger-balances`` and of any ``ledger-balances@N``.
The answer must equal the sequential replay of the messages at or below the checkpoints of
one of them (on MySQL, between the ``RENAME TABLE`` and the rows' swap, the declared table
is the new version's and its rows still ``@2``'s): a bisection per partition
(``crc32(source) % 8``) in the replay's running totals. An answer matching none is
**partial or empty** if empty or with fewer accounts or entries than an earlier one, else
**mixed versions**; **went back** counts answers with fewer accounts or entries than an
earlier one (no account is reopened: both only grow) or a shorter replay in a partition.

Meanwhile this process appends single messages (an account opened, a transaction each)
every 50-150 ms, each timed from its commit to the commit of the live version's batch
applying it: ``--probes`` before the rebuild, then until the cutover (the appends flowing
during it). The rebuild is requested as ``projections rebuild`` does; the **cutover** is
when the ``consumers`` row shows version 2. The rebuild's rate (messages version 2 applied
over its first claim -> the cutover) is set against the steady rate (goal >= 0.8). Exits 1
if a read was partial, mixed, went back or failed, or the read model (compared with a
sequential replay at the end) is wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import random
import sys
import tempfile
import threading
import time
import zlib
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from clusters import lag, ledger_matches_replay, wait_until
from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy.pool import NullPool

from handover import BenchmarkFailure, Cluster, mysql_database, sqlite_database
from latency import _percentile
from messaging import Database, MessageStore
from messaging._messages import registry
from projections._operations import rebuild
from projections.examples import ledger
from throughput import seed

CONSUMER = "ledger-balances"
BUILDING = f"{CONSUMER}@2"
PARTITIONS = 8
BATCH = 500  # the default batch-size
EVERY = 0.010  # seconds between the reader's reads
GOAL = 0.8  # the rebuild's rate over the steady apply loop's
LOAD_CHUNK = 50_000
OPENED = registry.type_name(ledger.AccountOpened)
SIGNS = {registry.type_name(kind): sign for kind, sign in ledger._DELTA_SIGN.items()}


class Replay:
    """Per partition, the ledger replay's running totals (accounts, entries, balance) after
    each of its messages, by position; loaded from the store as far as asked."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.positions = [array("q") for _ in range(PARTITIONS)]
        self.totals = [[array("q"), array("q"), array("q")] for _ in range(PARTITIONS)]
        self.running = [[0, 0, 0] for _ in range(PARTITIONS)]
        self.accounts: dict[str, list[int]] = {}  # account -> [entries, balance]
        self.loaded = 0  # every message at or below this position is in

    def load(self, upto: int) -> None:
        """Load the messages up to ``upto``: a checkpoint, so all of them are committed."""
        m = self.db.schema.messages
        while self.loaded < upto:
            query = (
                select(m.c.position, m.c.source, m.c.type, m.c.payload)
                .where(m.c.tenant == self.db.tenant, m.c.topic == ledger.TOPIC)
                .where(m.c.position > self.loaded, m.c.position <= upto)
                .order_by(m.c.position)
                .limit(LOAD_CHUNK)
            )
            with self.db.read() as conn:
                rows = conn.execute(query).all()
            for position, source, type_name, payload in rows:
                self._add(int(position), source, type_name, payload)
            self.loaded = int(rows[-1][0]) if len(rows) == LOAD_CHUNK else upto

    def _add(self, position: int, account: str, type_name: str, payload: str) -> None:
        if type_name != OPENED and type_name not in SIGNS:
            return
        p = zlib.crc32(account.encode()) % PARTITIONS  # its source (the partition key)
        run, row = self.running[p], self.accounts.get(account)
        if type_name == OPENED:  # (re)opened: the account starts again from (owner, 0, 0)
            if row is None:
                run[0] += 1
            else:
                run[1] -= row[0]
                run[2] -= row[1]
            self.accounts[account] = [0, 0]
        else:
            if row is None:  # the projection inserts a row for it
                run[0] += 1
                row = self.accounts[account] = [0, 0]
            amount = SIGNS[type_name] * int(json.loads(payload)["amount"])
            row[0] += 1
            row[1] += amount
            run[1] += 1
            run[2] += amount
        self.positions[p].append(position)
        for total, value in zip(self.totals[p], run, strict=True):
            total.append(value)

    def at(self, checkpoints: dict[int, int]) -> tuple[tuple[int, int, int], list[int]]:
        """The replay's (accounts, entries, balance) at ``checkpoints``, and the number of
        messages replayed per partition."""
        counts = [bisect_right(ps, checkpoints.get(p, 0)) for p, ps in enumerate(self.positions)]
        pairs = list(zip(self.totals, counts, strict=True))
        sums = [sum(totals[i][k - 1] for totals, k in pairs if k) for i in range(3)]
        return (sums[0], sums[1], sums[2]), counts


class Checks:
    """The reader's counts; ``bad``: the first wrong answers, with what was expected."""

    def __init__(self) -> None:
        self.reads = self.during = self.partial = self.mixed = self.went_back = 0
        self.slowest, self.errors, self.bad = 0.0, list[str](), list[str]()
        self.matched: Counter[str] = Counter()
        self.high = (0, 0)  # the most accounts and entries answered so far
        self.prefix = [0] * PARTITIONS  # the longest replayed prefix per partition so far

    def check(self, answer: Sequence[Any], rows: Sequence[Any], replay: Replay) -> None:
        units: dict[str, dict[int, int]] = {}
        for unit, partition, checkpoint in rows:
            units.setdefault(unit, {})[int(partition)] = int(checkpoint)
        replay.load(max((c for cps in units.values() for c in cps.values()), default=0))
        seen = (int(answer[0]), int(answer[1] or 0), int(answer[2] or 0))
        expected = {unit: replay.at(cps) for unit, cps in sorted(units.items())}
        matches = {u: counts for u, (value, counts) in expected.items() if value == seen}
        below = seen[0] < self.high[0] or seen[1] < self.high[1]
        self.reads += 1
        if matches:
            self.matched["+".join(matches)] += 1
            forward = [c for c in matches.values() if all(map(int.__ge__, c, self.prefix))]
            below |= not forward
            for counts in forward[:1]:
                self.prefix = counts
        elif seen[0] == 0 or below:
            self.partial += 1
        else:
            self.mixed += 1
        self.went_back += below
        if (below or not matches) and len(self.bad) < 5:
            wanted = {u: (v, units[u]) for u, (v, _) in expected.items()}
            self.bad.append(f"answer {seen}, replay at each unit's checkpoints {wanted}")
        self.high = (max(self.high[0], seen[0]), max(self.high[1], seen[1]))


def read_model_reader(url: str, prefix: str, ready: Any, halt: Any, window: Any, out: Any) -> None:
    """The reader process: check a snapshot every :data:`EVERY` seconds until ``halt``;
    counts the reads between ``window[0]`` and ``window[1]`` (wall clock) as during the
    rebuild; puts its :class:`Checks` as a dict in ``out``."""
    db = Database(url, table_prefix=prefix)
    replay, checks = Replay(db), Checks()
    sqlite = db.is_sqlite
    level = {} if sqlite else {"isolation_level": "REPEATABLE READ"}
    engine = create_engine(db.url, poolclass=NullPool, **level)
    if sqlite:  # BEGIN is ours to issue, as the framework's own engine does
        event.listen(engine, "connect", lambda dbapi, _: setattr(dbapi, "isolation_level", None))
    begin = "BEGIN" if sqlite else "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"
    model = text(f"SELECT count(*), sum(entries), sum(balance) FROM {ledger.balances.name}")
    checkpoints = text(
        f"SELECT consumer, partition_no, checkpoint FROM {db.schema.partitions.name} "
        "WHERE tenant = :tenant AND (consumer = :name OR consumer LIKE :versions)"
    )
    names = {"tenant": db.tenant, "name": CONSUMER, "versions": f"{CONSUMER}@%"}
    conn = engine.connect()
    try:

        def snapshot() -> tuple[Any, list[Any]]:
            conn.exec_driver_sql(begin)
            try:
                return conn.execute(model).one(), list(conn.execute(checkpoints, names).all())
            finally:
                conn.rollback()

        answer, rows = snapshot()
        checks.check(answer, rows, replay)  # loads what the live version applied so far
        ready.set()
        due = time.monotonic()
        while not halt.is_set():
            due = max(due + EVERY, time.monotonic())
            time.sleep(max(0.0, due - time.monotonic()))
            asked, wall = time.perf_counter(), time.time()
            try:
                answer, rows = snapshot()
            except Exception as exc:  # a failed read is a failure of the benchmark
                checks.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                conn.close()
                conn = engine.connect()
                continue
            checks.slowest = max(checks.slowest, time.perf_counter() - asked)
            checks.check(answer, rows, replay)
            checks.during += window[0] <= wall <= window[1]
    finally:
        conn.close()
        out.put({k: v for k, v in vars(checks).items() if k not in ("high", "prefix")})
        engine.dispose()
        db.dispose()


class Events:
    """The probe plugin's events, read from the cluster's file as it grows."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.offset, self.rows = cluster, 0, list[dict[str, Any]]()

    def update(self) -> list[dict[str, Any]]:
        """The events recorded since the last call (all of them are kept in ``rows``)."""
        with open(self.cluster.events_path, "rb") as stream:
            stream.seek(self.offset)
            data = stream.read()
        self.offset += (end := data.rfind(b"\n") + 1)
        self.rows += (new := [json.loads(line) for line in data[:end].splitlines()])
        return new

    def of(self, kind: str, unit: str) -> list[dict[str, Any]]:
        return [e for e in self.rows if e["event"] == kind and e.get("consumer") == unit]


def steady_rate(events: Events, seeded: int) -> tuple[float, float]:
    """Wait until the live version has applied ``seeded`` messages; (seconds from the first
    claim to the batch that completed them, messages/s)."""

    def applied() -> Any:
        events.update()
        events.cluster.check_alive()
        batches = events.of("applied", CONSUMER)
        totals = list(accumulate(e["count"] for e in batches))
        return next((e["t"] for e, n in zip(batches, totals, strict=True) if n >= seeded), None)

    done: float = wait_until(applied, timeout=120 + seeded / 1000, what="the first pass")
    seconds = done - min(e["t"] for e in events.of("claimed", CONSUMER))
    return seconds, seeded / seconds


def probe(db: Database, events: Events, account: str) -> tuple[float, float, str]:
    """Append one message, in a transaction of its own; (its commit, the commit of the first
    batch applying it, by which unit)."""
    time.sleep(random.uniform(0.05, 0.15))
    with db.transaction() as conn:
        (position,) = MessageStore(db).append(
            conn, ledger.TOPIC, account, [ledger.AccountOpened(account, "ada")]
        )
    committed = time.time()
    while True:
        for e in events.update():
            unit = e.get("consumer")
            if e["event"] == "applied" and unit in (CONSUMER, BUILDING) and e["last"] >= position:
                return committed, float(e["t"]), str(unit)
        if time.time() > committed + 60:
            raise BenchmarkFailure(f"position {position} was not applied within 60 s")
        events.cluster.check_alive()
        time.sleep(0.005)


class Cutover(threading.Thread):
    """Notes when the projection's ``consumers`` row first shows ``cutting-over`` (the live
    version stopped), then version 2 (the cutover)."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.db, self.stopped, self.at, self.done = db, math.inf, math.inf, threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        c = self.db.schema.consumers
        query = select(c.c.state, c.c.version).where(c.c.tenant == self.db.tenant)
        try:
            while not self.done.wait(0.01):
                with self.db.read() as conn:
                    state, version = conn.execute(query.where(c.c.name == CONSUMER)).one()
                if state == "cutting-over" or version == 2:  # (stop and swap between two polls)
                    self.stopped = min(self.stopped, time.time())
                if version == 2:
                    self.at = time.time()
                    self.done.set()
        except BaseException as exc:
            self.error = exc
            self.done.set()


def measure(db: Database, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Seed, apply, then rebuild under the reader's eye; what the report prints."""
    found: dict[str, Any] = {}
    messages, started = db.schema.messages, time.time()
    seed(db, args.messages)  # 10,000 a transaction, as throughput.py does
    with db.read() as conn:
        seeded = conn.execute(select(func.count(messages.c.position))).scalar_one()
    found.update(seeded=seeded, seeding=time.time() - started)
    events, context = Events(cluster := Cluster(db, tmp, BATCH, idle=None)), mp.get_context("spawn")
    halt, ready, out = context.Event(), context.Event(), context.Queue()
    window = context.Array("d", [math.inf, math.inf])
    shared = (db.url, db.schema.prefix, ready, halt, window, out)
    reader = context.Process(target=read_model_reader, args=shared, daemon=True)
    cutover = Cutover(db)
    try:
        for _ in range(2):
            cluster.start()
        found["steady"] = steady_rate(events, seeded)
        wait_until(lambda: lag(db) == 0, timeout=60, what="the live version to catch up")
        reader.start()
        while not ready.wait(0.5):
            if not reader.is_alive():
                raise BenchmarkFailure("the reader failed before its first read")
        probes = [probe(db, events, f"probe-b-{n:05d}") for n in range(args.probes)]
        found["before"] = [applied - committed for committed, applied, _ in probes]
        with db.read() as conn:
            head = conn.execute(select(func.count(messages.c.position))).scalar_one()
        rebuild(db, CONSUMER, who="benchmarks/rebuild.py", reason="bench")
        window[0] = requested = time.time()
        cutover.start()
        probes = []
        while not cutover.done.is_set():
            probes.append(probe(db, events, f"probe-d-{len(probes):05d}"))
            if time.time() > requested + 600 + seeded / 500:
                raise BenchmarkFailure("no cutover in time")
        if cutover.error is not None:
            raise BenchmarkFailure(f"watching for the cutover failed: {cutover.error!r}")
        window[1] = cut = cutover.at
        # Applied by the new version once the live one stopped: read from the swap on.
        found["during"] = [
            (max(applied, cut) if unit == BUILDING and applied >= cutover.stopped else applied)
            - committed
            for committed, applied, unit in probes
        ]
        wait_until(lambda: lag(db) == 0, timeout=120, what="version 2 to catch up")
        time.sleep(1.0)  # reads after the cutover too
        halt.set()
        found["reader"] = out.get(timeout=60)
        reader.join(timeout=30)
        events.update()
        built = [e for e in events.of("applied", BUILDING) if e["t"] <= cut]
        first = min(e["t"] for e in events.of("claimed", BUILDING))
        found["build"] = (sum(e["count"] for e in built), cut - first, cut - requested)
        totals = accumulate(e["count"] for e in built)  # (the probes during it are few)
        caught = next(e["t"] for e, n in zip(built, totals, strict=False) if n >= head)
        found["phases"] = (first - requested, caught - first, head, cutover.stopped - caught)
    finally:
        halt.set()
        cutover.done.set()
        cluster.stop_all()
        if reader.is_alive():
            reader.terminate()
    actual, expected = ledger_matches_replay(db)
    found["verified"] = actual == expected
    return found


def report(label: str, found: dict[str, Any]) -> bool:
    """Print the figures; whether every read and the read model were right."""
    seeded, (seconds, steady) = found["seeded"], found["steady"]
    built, build_seconds, to_cutover = found["build"]
    claim, catch_up, applied, stop = found["phases"]
    rate, r = built / build_seconds, found["reader"]
    mark = "" if rate / steady >= GOAL else "  BELOW THE GOAL"
    swap = to_cutover - claim - catch_up - stop
    print(
        f"rebuild, {label}: {seeded:,} ledger messages (appended in {found['seeding']:.1f} s); "
        f"2 instances at the default settings (batch {BATCH}, rebalance-interval 10 s)\n"
        f"  steady apply loop: {seeded:,} messages in {seconds:.2f} s (first claim -> the "
        f"batch completing them): {steady:,.0f} msg/s\n"
        f"  rebuild: {built:,} messages built in {build_seconds:.2f} s ({BUILDING}'s first "
        f"claim -> cutover): {rate:,.0f} msg/s\n"
        f"  ratio rebuild / steady apply: {rate / steady:.2f} (goal >= {GOAL}){mark}\n"
        f"  request -> cutover: {to_cutover:.2f} s: {BUILDING}'s first claim after {claim:.2f} "
        f"s; it applied the {applied:,} messages stored at the request in {catch_up:.2f} s "
        f"({applied / catch_up:,.0f} msg/s, {applied / catch_up / steady:.2f} x steady); the "
        f"live version stopped {stop:.2f} s later, the swap came {swap:.2f} s after that\n"
        "  live version's latency, append commit -> batch commit, one message every "
        f"50-150 ms:\n    {'':<18} {'n':>4} {'p50':>8} {'p99':>8} {'max':>8}"
    )
    for when in ("before", "during"):
        values = found[when] or [math.nan]
        p50, p99 = (_percentile(values, q) * 1000 for q in (50, 99))
        print(
            f"    {when} the rebuild {len(found[when]):>4} {p50:>6.1f}ms {p99:>6.1f}ms "
            f"{max(values) * 1000:>6.1f}ms"
        )
    matched = ", ".join(f"{unit} {n}" for unit, n in sorted(r["matched"].items()))
    print(
        "  reader, one snapshot transaction every 10 ms (the declared table, every version's "
        f"checkpoints):\n  reads {r['reads']}, partial or empty {r['partial']}, mixed "
        f"versions {r['mixed']}, went back {r['went_back']}\n    {r['during']} reads during "
        f"the rebuild; errors {len(r['errors'])}; slowest read {r['slowest'] * 1000:.1f} ms; "
        f"answers matching the checkpoints of {matched}"
    )
    for line in r["bad"] + r["errors"][:5]:
        print(f"    {line}")
    verified = bool(found["verified"])
    print(f"  the read model equals the sequential replay: {'yes' if verified else 'NO'}")
    return verified and r["partial"] + r["mixed"] + r["went_back"] + len(r["errors"]) == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mysql-url", help="also on MySQL/MariaDB (a scratch database)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="ledger messages")
    parser.add_argument("--probes", type=int, default=100, help="latency probes before")
    args = parser.parse_args(argv)
    ok = True
    try:
        with tempfile.TemporaryDirectory(prefix="rebuild-") as tmp_dir:
            tmp = Path(tmp_dir)
            with sqlite_database(tmp, "rebuild.db") as db:
                ok &= report("sqlite", measure(db, tmp, args))
            if args.mysql_url:
                print()
                with mysql_database(args.mysql_url) as db:
                    ok &= report("mysql", measure(db, tmp, args))
    except (BenchmarkFailure, AssertionError) as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
