"""Read your own writes: commit-to-wait-return latency, and what many waiters cost.

Run as ``python benchmarks/wait.py [--mysql-url URL] [--appends N] [--waiters N]``.

Per backend:

1. **Same process**: an instance of the ledger app runs in this process on the same
   ``Database`` object; one message is appended at a time (100-300 ms apart), and
   ``wait_for`` is called right after its commit. The latency is from the commit to the
   wait's return (the instance's batch commit kicks the shared watcher). Goal: p99 ≤ 20 ms.
2. **Across processes**: two ``projections run`` processes apply the ledger (the
   sub-second test intervals, idle-poll-interval 50 ms). On the same host their batch
   commits wake the waiter's watcher here (goal: p99 ≤ 20 ms); with another temporary
   directory (as on another host: no wake-up either way) the waiter learns of their
   checkpoints only by polling, every ``poll_interval`` = the idle-poll-interval (goal:
   p99 ≤ the instances' pulse plus one poll interval, 120 ms).
3. **Statements with 1 and with N concurrent waiters** (default 1,000), on tokens nothing
   applies (no instance running): statements per second the waiters' engine sends over
   2 s once every wait had its first check (counted with a cursor-execute listener).
   Goal: ratio ≤ 1.1.

It prints the figures beside the goals and exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sqlalchemy import event

from handover import BenchmarkFailure, Cluster, mysql_database, sqlite_database
from messaging import (
    Appended,
    ConsistencyToken,
    Database,
    Instance,
    MessageStore,
    Settings,
    collect_consumers,
    create_plugin_manager,
    wait_for,
)
from messaging.waits._watcher import watcher_for
from projections.examples import ledger

CONSUMER = "ledger-balances"
SAME_PROCESS_P99 = 0.020
RATIO = 1.1

OpenDb = Callable[[str], AbstractContextManager[Database]]


def _percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _append(db: Database, account: str) -> Appended:
    with db.transaction() as conn:
        return MessageStore(db).append(conn, ledger.TOPIC, account, [ledger.Deposited(account, 1)])


def _latencies(db: Database, appends: int, seed: int, poll_interval: float) -> list[float]:
    """Append one message at a time; commit-to-wait-return of each, in seconds."""
    rng = random.Random(seed)
    found = []
    for n in range(appends):
        time.sleep(rng.uniform(0.1, 0.3))  # light load: the pace of the appends
        appended = _append(db, f"wait-{seed}-{n % 50}")
        committed = time.perf_counter()
        wait_for(db, appended.token, CONSUMER, timeout=30, poll_interval=poll_interval)
        found.append(time.perf_counter() - committed)
    return found


def _line(label: str, values: list[float], goal: float | None) -> bool:
    p50, p99 = _percentile(values, 50), _percentile(values, 99)
    missed = goal is not None and p99 > goal
    print(
        f"  {label:<44} p50 {p50 * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms  "
        f"max {max(values) * 1000:6.1f} ms  mean {statistics.mean(values) * 1000:6.1f} ms"
        + (f"  (goal p99 <= {goal * 1000:.0f} ms{': MISSED' if missed else ''})" if goal else "")
    )
    return missed


def _instance(db: Database) -> Instance:
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    return Instance(db, collect_consumers(manager), Settings(), manager.hook, name="bench")


def same_process(db: Database, appends: int) -> bool:
    instance = _instance(db)
    instance.start()
    try:
        _latencies(db, 5, 0, 0.05)  # warm up: partitions claimed, statements learnt
        return _line(
            "same process (batch commit kicks)", _latencies(db, appends, 1, 0.05), SAME_PROCESS_P99
        )
    finally:
        instance.stop()


def across_processes(db: Database, tmp: Path, appends: int, *, same_host: bool) -> bool:
    """Two instance processes apply; this process appends and waits. ``same_host``: they
    share the wake-up directory (each batch commit wakes the wait's watcher here, each
    append wakes them); otherwise they use another temporary directory, as on another
    host, and the wait learns of their commits by polling."""
    cluster = Cluster(db, tmp, 100, idle="50ms")
    kept = os.environ.get("TMPDIR")
    if not same_host:
        os.environ["TMPDIR"] = str(tmp / "another-host")
        (tmp / "another-host").mkdir(exist_ok=True)
    try:
        started = [cluster.start(), cluster.start()]
    finally:
        if kept is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = kept
    try:
        cluster.wait_balanced(started)
        interval = cluster.settings.idle_poll_interval
        _latencies(db, 5, 0, interval)
        values = _latencies(db, appends, 2, interval)
        if same_host:
            return _line("2 processes, same host (commits wake)", values, SAME_PROCESS_P99)
        # the instances' own pulse (no wake-up by the append) plus the wait's poll
        return _line(
            f"2 processes, no wake-up, polled every {interval * 1000:.0f} ms",
            values,
            2 * interval + 0.02,
        )
    finally:
        cluster.stop_all()


def _statements_per_second(db: Database, waiters: int, seconds: float = 2.0) -> float:
    """Statements per second ``db`` sends for ``waiters`` waits nothing applies (then an
    instance in this process applies them, and every wait must return)."""
    tokens = [_append(db, f"idle-{waiters}-{n % 100}").token for n in range(waiters)]
    failed: list[BaseException] = []

    def wait(token: ConsistencyToken) -> None:
        try:
            wait_for(db, token, CONSUMER, timeout=600)
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=wait, args=(t,), daemon=True) for t in tokens]
    for thread in threads:
        thread.start()
    watcher = watcher_for(db)
    deadline = time.monotonic() + 300
    while not (
        len(watcher._watches) >= waiters and all(w.seen is not None for w in list(watcher._watches))
    ):
        if time.monotonic() > deadline or failed:
            raise BenchmarkFailure(f"the waits were not all checked within 300 s: {failed[:1]}")
        time.sleep(0.01)
    count = [0]

    def counted(*_: object) -> None:
        count[0] += 1

    event.listen(db.engine, "before_cursor_execute", counted)
    started = time.monotonic()
    time.sleep(seconds)
    event.remove(db.engine, "before_cursor_execute", counted)
    rate = count[0] / (time.monotonic() - started)
    instance = _instance(db)
    instance.start()
    try:
        for thread in threads:
            thread.join(300)
    finally:
        instance.stop()
    if failed or any(thread.is_alive() for thread in threads):
        raise BenchmarkFailure(f"not every wait returned applied: {failed[:1]}")
    return rate


def many_waiters(db: Database, waiters: int) -> bool:
    instance = _instance(db)
    instance.start(loops=False)  # declared, then nobody applies until measured
    instance.stop()
    one = _statements_per_second(db, 1)
    many = _statements_per_second(db, waiters)
    ratio = many / one
    missed = ratio > RATIO
    print(
        f"  {'statements/s, idle waits':<44} 1 waiter {one:6.1f}/s  {waiters} waiters "
        f"{many:6.1f}/s  ratio {ratio:.2f} (goal <= {RATIO}{': MISSED' if missed else ''})"
    )
    return missed


def run_backend(label: str, open_db: OpenDb, tmp: Path, args: argparse.Namespace) -> int:
    print(f"wait_for, {label}: {args.appends} appends per latency run")
    missed = 0
    with open_db("same.db") as db:
        missed += same_process(db, args.appends)
    with open_db("across.db") as db:
        missed += across_processes(db, tmp, args.appends, same_host=True)
    with open_db("far.db") as db:
        missed += across_processes(db, tmp, args.appends, same_host=False)
    with open_db("many.db") as db:
        missed += many_waiters(db, args.waiters)
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mysql-url", help="also measure on MySQL/MariaDB (a scratch database)")
    parser.add_argument("--appends", type=int, default=200, help="appends per latency run")
    parser.add_argument("--waiters", type=int, default=1000, help="concurrent idle waiters")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="wait-") as tmp_dir:
            tmp = Path(tmp_dir)

            def sqlite(name: str) -> AbstractContextManager[Database]:
                return sqlite_database(tmp, name)

            missed = run_backend("sqlite", sqlite, tmp, args)
            if args.mysql_url:
                print()
                url = args.mysql_url

                def mysql(_name: str) -> AbstractContextManager[Database]:
                    return mysql_database(url)

                missed += run_backend("mysql", mysql, tmp, args)
    except (BenchmarkFailure, AssertionError) as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
