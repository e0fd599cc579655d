"""Latency from an append's commit to the commit of the read model that applies it.

Run as ``python benchmarks/latency.py [--mysql-url URL] [--messages N]``.

Two ``projections run`` processes of the ledger app at the default settings
(idle-poll-interval 200 ms) share the ``ledger-balances`` partitions and idle. Light
load: this process appends one message at a time, in a transaction of its own, every
100-400 ms (at random), and notes the time of the commit; the instance that applies it
records, from its ``projections_batch_applied`` hook (run right after its commit), the
time and the batch's last position (the probe of ``benchmarks/handover.py``). Each
latency is the second time minus the first.

It runs twice per backend: with the same-host wake-up (an appending commit wakes the
instances on this host at once, :mod:`messaging.store._wakeup`), and, as the baseline,
with the appender's wake-ups sent nowhere: the instances then learn of the message from
their pulse alone, once per idle-poll-interval. Each prints p50/p95/p99/max beside the
goal (p50 ≤ 50 ms, p99 ≤ 250 ms at the defaults).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from handover import (
    BenchmarkFailure,
    Cluster,
    mysql_database,
    sqlite_database,
)
from messaging import Database, MessageStore
from messaging.store._wakeup import WakeUps
from projections.examples import ledger

GOALS = {50: 0.050, 99: 0.250}
"""Percentile → the goal, in seconds."""


def _percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def measure(cluster: Cluster, db: Database, messages: int, seed: int) -> list[float]:
    """Append ``messages`` one by one under light load; their latencies in seconds."""
    store = MessageStore(db)
    rng = random.Random(seed)
    latencies = []
    for n in range(messages):
        time.sleep(rng.uniform(0.1, 0.4))
        with db.transaction() as conn:
            account = f"lat-{seed}-{n:05d}"
            (position,) = store.append(
                conn, ledger.TOPIC, account, [ledger.AccountOpened(account, "ada")]
            )
        committed = time.time()
        deadline = committed + 30
        while True:
            done = [e for e in cluster.events("applied", committed - 5) if e["last"] >= position]
            if done:
                latencies.append(min(e["t"] for e in done) - committed)
                break
            if time.time() > deadline:
                raise BenchmarkFailure(f"position {position} was not applied within 30 s")
            cluster.check_alive()
            time.sleep(0.005)
    return latencies


def run_backend(label: str, open_db: object, tmp: Path, messages: int) -> int:
    """Both runs on one backend; return how many percentiles are over their goal."""
    over = 0
    with open_db("latency.db") as db:  # type: ignore[operator]  # a context manager factory
        cluster = Cluster(db, tmp, 100, idle=None)
        try:
            names = [cluster.start(), cluster.start()]
            cluster.wait_balanced(names)
            results = {}
            wakeups = db.wakeups
            for mode, seed in (("with the same-host wake-up", 1), ("pulse alone (baseline)", 2)):
                db.wakeups = wakeups if seed == 1 else WakeUps("nowhere")
                results[mode] = measure(cluster, db, messages, seed)
            db.wakeups = wakeups
        finally:
            cluster.stop_all()
    print(
        f"latency, {label}: append commit -> read-model commit, {messages} single messages "
        "at 100-400 ms intervals, 2 instances at the default settings (idle-poll 200 ms)"
    )
    print(f"  {'':<28} {'p50':>7} {'p95':>7} {'p99':>7} {'max':>7} {'mean':>7}")
    for mode, values in results.items():
        p = {q: _percentile(values, q) for q in (50, 95, 99)}
        marks = [
            f"p{q} over its goal of {goal * 1000:.0f} ms"
            for q, goal in GOALS.items()
            if p[q] > goal and mode.startswith("with")
        ]
        over += len(marks)
        print(
            f"  {mode:<28} "
            + " ".join(f"{p[q] * 1000:>5.1f}ms" for q in (50, 95, 99))
            + f" {max(values) * 1000:>5.1f}ms {statistics.mean(values) * 1000:>5.1f}ms"
            + ("  " + "; ".join(marks) if marks else "")
        )
    base, woken = results["pulse alone (baseline)"], results["with the same-host wake-up"]
    ratio = _percentile(woken, 50) / _percentile(base, 50)
    print(f"  goal: p50 <= 50 ms, p99 <= 250 ms; ratio p50 wake-up / pulse alone: {ratio:.2f}")
    return over


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mysql-url", help="also measure on MySQL/MariaDB (a scratch database)")
    parser.add_argument("--messages", type=int, default=200, help="messages per run")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="latency-") as tmp_dir:
            tmp = Path(tmp_dir)
            over = run_backend("sqlite", lambda n: sqlite_database(tmp, n), tmp, args.messages)
            if args.mysql_url:
                print()
                mysql = lambda _n: mysql_database(args.mysql_url)  # noqa: E731
                over += run_backend("mysql", mysql, tmp, args.messages)
    except (BenchmarkFailure, AssertionError) as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
