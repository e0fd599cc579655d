"""Throughput and coordination cost as instances grow, with real ``projections run`` processes.

Run as ``python benchmarks/scale.py [--mysql-url URL] [--parts waiting,cpu,many]
[--sizes 1,2,4,8,16] [--many 64] [--few 4] [--intervals short,defaults] ...`` (``--help``
for the sizes; ``--quick`` for a small run of every part).

- **waiting**: a route consumer whose handler waits ``--delay`` per message (a simulated
  remote call) runs on each of ``--sizes`` instance processes (``executor.max-workers``
  ``--lanes`` batches at once each on MySQL; one on SQLite, whose single writer allows no
  more). A burst of messages, about ``--seconds`` of work at the linear rate, is appended
  in one transaction while they idle; the rate is the first 90 % of the burst over the
  time from its commit until the probes report them applied (the tail of the last
  partitions is not the instances' rate). Printed with the ratio to N x the 1-instance rate.
- **cpu**: the ledger projection (CPU-bound) on 1, then 2 workers, as in
  ``handover.py``'s throughput: the instances' and the database server's CPU seconds per
  message.
- **many**: ``--few``, then ``--many`` idle instances of the route consumer, at each of
  ``--intervals`` (``short``: sub-second test intervals; ``defaults``): statements per
  second per instance over ``--window`` seconds (each instance counts its own at the
  driver, so that counting leaves the fast path on), the rebalance rounds' time
  (``projections_rebalanced``), and at ``--many`` one join and one clean stop, timed as
  in ``handover.py`` and held to the bounds used there for 3 instances.

Every figure is printed with the load average before and after it and the cores that the
instances and the database server on this host kept busy (``costs.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent / "tests" / "support"), str(HERE)]

import attrs  # noqa: E402
from clusters import wait_until  # noqa: E402
from private_mariadb import PrivateMariaDB  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.pool import Pool  # noqa: E402

import messaging  # noqa: E402
from costs import Server, cpu_seconds, measured  # noqa: E402
from handover import (  # noqa: E402
    BenchmarkFailure,
    Cluster,
    _clean_stop,
    _join,
    _record,
    measure_throughput,
    mysql_database,
    print_handovers,
    sqlite_database,
)
from messaging import Database, HandlerContext, NewMessage, handler, message, route_consumer  # noqa: E402
from messaging._hookspecs import hookimpl  # noqa: E402
from messaging._messages import registry  # noqa: E402

DESTINATION = "scale-calls"
PARTITIONS = 128
"""Enough for 64 instances to own two each, and for a joiner to get some."""
DELAY_ENV = "SCALE_BENCHMARK_DELAY"
COUNTS_ENV = "SCALE_BENCHMARK_COUNTS"
APP = "scale"  # this file: the route consumer and the statement-counting probe
WAITING_BATCH = 10


@message("bench.scale.call")
@attrs.define(frozen=True)
class Call:
    n: int


@route_consumer(DESTINATION, partitions=PARTITIONS)
class RemoteCalls:
    """Waits the delay of a remote call per message; no database work of its own."""

    @handler
    def call(self, call: Call, ctx: HandlerContext) -> None:
        time.sleep(float(os.environ.get(DELAY_ENV, "0")))


# -- the probe: statements per process, rebalance rounds ------------------------------------


class _Statements:
    """Counts the statements (commits and rollbacks among them) that every connection of
    this process sends, at the driver, and writes the count to ``<COUNTS_ENV>/<pid>`` every
    200 ms. Counted below SQLAlchemy (sqlite3's trace callback; PyMySQL's ``query``, commit
    and rollback), so that counting leaves the statements' fast path on: an execute event
    would send every statement through SQLAlchemy and make each instance costlier to run."""

    count = 0
    lock = threading.Lock()

    @classmethod
    def start(cls, directory: str) -> None:
        event.listen(Pool, "connect", cls._watch)
        target = Path(directory) / str(os.getpid())
        threading.Thread(target=cls._write, args=(target,), daemon=True).start()

    @classmethod
    def _watch(cls, dbapi_connection: Any, _record: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.set_trace_callback(cls._add)
            return
        for name in ("query", "commit", "rollback"):
            setattr(dbapi_connection, name, cls._counted(getattr(dbapi_connection, name)))

    @classmethod
    def _counted(cls, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            cls._add()
            return method(*args, **kwargs)

        return counted

    @classmethod
    def _add(cls, *_: Any) -> None:
        with cls.lock:
            cls.count += 1

    @classmethod
    def _write(cls, target: Path) -> None:
        scratch = target.with_suffix(".tmp")
        while True:
            scratch.write_text(str(cls.count))
            scratch.replace(target)  # whole: a reader never sees half a number
            time.sleep(0.2)


if os.environ.get(COUNTS_ENV) and __name__ != "__main__":
    # an instance process loading this app: count from its first connection on
    _Statements.start(os.environ[COUNTS_ENV])


@hookimpl
def projections_rebalanced(instance_id: str, seconds: float, live_members: int) -> None:
    _record("rebalanced", instance=instance_id, seconds=seconds, members=live_members)


def statements(directory: Path, pids: Sequence[int]) -> dict[int, int]:
    """The statements each of ``pids`` has counted so far."""
    counts = {}
    for pid in pids:
        path = directory / str(pid)
        counts[pid] = int(path.read_text()) if path.exists() else 0
    return counts


# -- a cluster of the route consumer ---------------------------------------------------------


@attrs.define
class Setup:
    """What every part runs on: the database, a scratch directory, the options."""

    db: Database
    tmp: Path
    args: argparse.Namespace

    @property
    def lanes(self) -> int:
        return 1 if self.db.is_sqlite else int(self.args.lanes)

    def cluster(self, idle: str | None, batch: int = WAITING_BATCH) -> Cluster:
        """The route consumer's cluster at sub-second intervals (``idle`` the idle-poll
        interval) or at the defaults (None), ``--lanes`` executor workers."""
        extra = f"    executor: {{max-workers: {self.args.lanes}}}\n"  # under consumer:
        return Cluster(
            self.db,
            self.tmp,
            batch,
            idle=idle,
            app=APP,
            extra=extra,
            consumer=DESTINATION,
            timeout=self.args.start_timeout,
        )

    def pids(self, cluster: Cluster) -> list[int]:
        return [p.pid for n, p in cluster.processes.items() if n not in cluster.gone]


def started(cluster: Cluster, count: int, wave: int | None = None) -> list[str]:
    """``count`` instances started and sharing every partition: all together, or ``wave``
    at a time, each wave registered before the next starts (as a rolling start would:
    64 processes starting at once on 2 cores queue for minutes on the generation row)."""
    names: list[str] = []
    while len(names) < count:
        batch = [cluster.start() for _ in range(min(wave or count, count - len(names)))]
        for name in batch:
            cluster.instance_id(name)
        names += batch
    cluster.wait_balanced(names)
    return names


def append_calls(db: Database, count: int, first: int) -> float:
    """Append ``count`` calls in one transaction (each its own source); when it committed."""
    type_name, _ = registry.encode(Call(0))
    messages = [
        NewMessage(
            topic=DESTINATION,
            source=f"call-{n}-{uuid.uuid4().hex}",  # random: CRC32 of "call-<n>" cycles
            type=type_name,
            payload=registry.encode(Call(n))[1],
        )
        for n in range(first, first + count)
    ]
    with db.transaction() as conn:
        messaging.MessageStore(db, registry).append_encoded(conn, messages)
    return time.time()


# -- waiting consumers ------------------------------------------------------------------------


def waiting(setup: Setup) -> None:
    args = setup.args
    os.environ[DELAY_ENV] = str(args.delay)
    per_instance = setup.lanes / args.delay
    print(
        f"waiting consumers: route consumer, {PARTITIONS} partitions, handler waits "
        f"{args.delay * 1000:g} ms per message, batch {WAITING_BATCH}, {setup.lanes} lane(s) "
        f"per instance (linear: {per_instance:,.0f} msg/s per instance)"
    )
    first, base = 0, 0.0
    for size in args.sizes:
        cluster = setup.cluster(None)  # the default intervals, as in production
        try:
            started(cluster, size)
            count = max(size * setup.lanes * WAITING_BATCH, int(size * per_instance * args.seconds))
            server = Server(setup.db.url)
            pids = setup.pids(cluster)
            with measured(server, partial(cpu_seconds, pids)) as costs:
                since = time.time()
                committed = append_calls(setup.db, count, first)
                events = applied(cluster, since, count)
        finally:
            cluster.stop_all()
        first += count
        workers = len({e["pid"] for e in events})  # SQLite: a batch holds the only writer
        rate = first_90(events, count, committed)
        base = base or rate / size
        busy = sum(e["seconds"] for e in events)
        lanes = size * setup.lanes * (max(e["t"] for e in events) - committed)
        plain = plain_rate(size, setup.lanes, count, args.delay)
        print(
            f"  {size:>2} instance(s): {rate:>8,.0f} msg/s  ratio to linear "
            f"{rate / (size * base):.2f}, to plain threads {rate / plain:.2f} ({count} calls, "
            f"applied by {workers} of them; plain {plain:,.0f} msg/s); lanes busy "
            f"{busy / lanes:.0%}, {busy / count * 1000:.1f} ms per call in a batch; "
            f"{costs.describe()}",
            flush=True,
        )


PLAIN = """
import sys, threading, time
calls, delay, lanes = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
def lane(n):
    for _ in range(n):
        time.sleep(delay)
threads = [threading.Thread(target=lane, args=(calls // lanes + (k < calls % lanes),))
           for k in range(lanes)]
for t in threads: t.start()
for t in threads: t.join()
print(time.time(), flush=True)
"""


def plain_rate(size: int, lanes: int, count: int, delay: float) -> float:
    """The machine's own ceiling for the same calls: ``size`` plain processes of ``lanes``
    threads waiting ``delay`` per call, no framework, started together once all are up;
    calls/s from the go to the last end."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PLAIN, str(count // size), str(delay), str(lanes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(size)
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
        go = time.time()
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        ends = [float(p.communicate(timeout=600)[0]) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return size * (count // size) / (max(ends) - go)


def applied(cluster: Cluster, since: float, count: int) -> list[dict[str, Any]]:
    """Wait until the probes report ``count`` messages applied since ``since``."""

    def done() -> list[dict[str, Any]] | None:
        cluster.check_alive()
        events = cluster.events("applied", since)
        return events if sum(e["count"] for e in events) >= count else None

    found: list[dict[str, Any]] = wait_until(done, timeout=600, what=f"{count} applied")
    return found


def first_90(events: Sequence[dict[str, Any]], count: int, committed: float) -> float:
    """Messages/s of the first 90 % of ``count`` (the batches' ends), from ``committed``."""
    total = 0
    for e in sorted(events, key=lambda e: e["t"]):
        total += int(e["count"])
        if total >= 0.9 * count:
            return total / max(float(e["t"]) - committed, 1e-9)
    raise BenchmarkFailure("fewer messages applied than counted")


# -- CPU per message ------------------------------------------------------------------------


def cpu(setup: Setup) -> None:
    args = setup.args
    print(
        f"CPU per message: ledger projection, bursts of {args.messages} messages, "
        f"{args.runs} per worker count"
    )
    per_message = {}
    for workers in (1, 2):
        rates, costs = measure_throughput(setup.db, setup.tmp, workers, args.messages, args.runs)
        own, server = costs.per_item()
        per_message[workers] = own + server
        print(
            f"  {workers} worker(s): {statistics.median(rates):>8,.0f} msg/s; CPU per message: "
            f"instances {own * 1e6:.0f} µs, database server {server * 1e6:.0f} µs; "
            f"{costs.describe()}",
            flush=True,
        )
    print(f"  CPU per message, 2 workers / 1 worker: {per_message[2] / per_message[1]:.2f}")


# -- many instances -------------------------------------------------------------------------


def many(setup: Setup) -> None:
    args = setup.args
    counts = setup.tmp / "statements"
    counts.mkdir(exist_ok=True)
    os.environ[COUNTS_ENV] = str(counts)
    os.environ[DELAY_ENV] = "0"
    for intervals in args.intervals:
        idle = "50ms" if intervals == "short" else None
        per_instance = {}
        for size in (args.few, args.many):
            cluster = setup.cluster(idle)
            try:
                names = started(cluster, size, args.wave)
                per_instance[size] = idle_statements(setup, cluster, counts, intervals, size)
                if size == args.many:
                    handovers(cluster, names, intervals)
            finally:
                cluster.stop_all()
        ratio = per_instance[args.many] / per_instance[args.few]
        print(
            f"  statements/s per instance, {args.many} / {args.few} instances: {ratio:.2f} "
            f"(goal <= 1.20)",
            flush=True,
        )


def idle_statements(
    setup: Setup, cluster: Cluster, counts: Path, intervals: str, size: int
) -> float:
    """Statements/s per instance of the idle ``cluster`` over ``--window``; printed."""
    settle = 2 * cluster.settings.rebalance_interval
    time.sleep(settle)  # the rounds after the last start have run: the steady state
    pids = setup.pids(cluster)
    window = setup.args.window
    since = time.time()
    server = Server(setup.db.url)
    connections = len(server.serving()) / size if server.pids else 0.0
    with measured(server, lambda: cpu_seconds(pids)) as costs:
        before = statements(counts, pids)
        time.sleep(window)  # what is measured: the idle load over a stretch of time
        after = statements(counts, pids)
    rates = [(after[p] - before[p]) / window for p in pids]
    rounds = [e["seconds"] for e in cluster.events("rebalanced", since)]
    per = float(statistics.mean(rates))
    print(
        f"many instances, {intervals} intervals: {size} idle instances: {per:.2f} "
        f"statements/s per instance (min {min(rates):.2f}, max {max(rates):.2f}; "
        f"all {per * size:,.0f}/s; server connections per instance {connections:.1f}); "
        f"rebalance rounds {len(rounds)}, "
        f"{_round_times(rounds)}; {costs.describe()}",
        flush=True,
    )
    return per


def _round_times(rounds: Sequence[float]) -> str:
    if not rounds:
        return "none in the window"
    return f"median {statistics.median(rounds) * 1000:.0f} ms, max {max(rounds) * 1000:.0f} ms"


def handovers(cluster: Cluster, names: list[str], intervals: str) -> None:
    """One join and one clean stop among ``names``; printed beside the bounds for 3."""
    since = time.time()
    join = _join(cluster, names)
    leaver = names.pop(0)
    stop = _clean_stop(cluster, leaver, names)
    rounds = [e["seconds"] for e in cluster.events("rebalanced", since)]
    batches = [e["seconds"] for e in cluster.events("applied", since)]
    print(
        f"  handovers at {len(names)} instances, {intervals} intervals (rebalance-interval "
        f"{cluster.settings.rebalance_interval:g}s): join (start -> its last claim), clean "
        f"stop (release -> last claim); bounds and goals as for 3 instances (handover.py)"
    )
    times = {"join": [join], "clean stop": [stop], "batch": batches}
    print_handovers(cluster.settings, times)
    print(f"  rebalance rounds during the handovers: {len(rounds)}, {_round_times(rounds)}")


# -- driving --------------------------------------------------------------------------------

PARTS: dict[str, Callable[[Setup], None]] = {"waiting": waiting, "cpu": cpu, "many": many}
QUICK = [
    "--sizes=1,2",
    "--few=2",
    "--many=3",
    "--seconds=1",
    "--messages=300",
    "--runs=1",
    "--window=1",
    "--intervals=short",
]


def run_backend(label: str, open_db: Any, tmp: Path, args: argparse.Namespace) -> None:
    print(f"\n== {label} ({os.cpu_count()} cores)", flush=True)
    for part in args.parts:
        with open_db(f"{part}.db") as db:
            PARTS[part](Setup(db, tmp, args))


def mysql_scratch(args: argparse.Namespace) -> Callable[[str], Any]:
    return lambda _name: mysql_database(args.mysql_url)


def _list(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(item) for item in text.split(",") if item]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--mysql-url", help="also on MySQL/MariaDB at this URL (a scratch database)")
    add("--no-sqlite", action="store_true", help="MySQL/MariaDB only")
    add(
        "--private-mariadb",
        action="store_true",
        help="instead of --mysql-url, a MariaDB server of this run's own (max-connections "
        "4000: 64 instances need more connections than a default server allows)",
    )
    add("--quick", action="store_true", help="small sizes: " + " ".join(QUICK))
    add("--parts", type=_list(str), default=list(PARTS), help="waiting,cpu,many")
    add("--sizes", type=_list(int), default=[1, 2, 4, 8, 16], help="waiting: instances")
    add("--delay", type=float, default=0.05, help="waiting: seconds per call (0.05)")
    add("--lanes", type=int, default=4, help="waiting: executor.max-workers (MySQL; 4)")
    add("--seconds", type=float, default=8.0, help="waiting: seconds of work per burst (8)")
    add("--messages", type=int, default=20_000, help="cpu: messages per burst (20000)")
    add("--runs", type=int, default=3, help="cpu: bursts per worker count (3)")
    add("--few", type=int, default=4, help="many: the small cluster (4)")
    add("--many", type=int, default=64, help="many: the big cluster (64)")
    add("--wave", type=int, default=8, help="many: instances started at once (8)")
    add("--window", type=float, default=20.0, help="many: seconds statements are counted")
    add("--intervals", type=_list(str), default=["short", "defaults"], help="short,defaults")
    add("--start-timeout", type=float, default=600.0, help="seconds a cluster may take to start")
    args = parser.parse_args(argv)
    if args.quick:
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), *QUICK])
    unknown = set(args.parts) - set(PARTS) or set(args.intervals) - {"short", "defaults"}
    if unknown:
        parser.error(f"unknown --parts or --intervals: {sorted(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up on SIGTERM too
    try:
        with tempfile.TemporaryDirectory(prefix="scale-") as tmp_dir:
            tmp = Path(tmp_dir)
            if not args.no_sqlite:
                run_backend("sqlite", lambda name: sqlite_database(tmp, name), tmp, args)
            if args.private_mariadb:
                (tmp / "mariadb").mkdir()
                private = PrivateMariaDB(tmp / "mariadb", args=["--max-connections=4000"])
                private.start()
                try:
                    private.execute("CREATE DATABASE scale")
                    args.mysql_url = private.url("scale")
                    run_backend("mariadb (private)", mysql_scratch(args), tmp, args)
                finally:
                    private.stop()
            elif args.mysql_url:
                run_backend("mysql", mysql_scratch(args), tmp, args)
    except (BenchmarkFailure, AssertionError) as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
