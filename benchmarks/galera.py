"""Append and apply rates on a 3-node Galera cluster beside a single MariaDB server, same
run, and what a node's death costs.

Run as ``python benchmarks/galera.py [--messages N]`` (root, MariaDB and galera-4
installed). Starts a private single server and a loopback Galera cluster
(tests/support/galera_cluster.py) with the same InnoDB settings, then on each:

- **append, one writer**: ``append_lines`` of N ledger messages, batches of 100, in this
  process (on the cluster through node 0);
- **append, three writers**: three ``projections append`` processes of N/3 lines each at
  once (on the cluster one per node: their certification conflicts are retried);
- **apply**: two ``projections run`` instances (on the cluster on nodes 0 and 1) catch up
  with everything appended; the rate counts from the first checkpoint to the last.

Then on the cluster only, with traffic appended through node 2 at about 200 messages/s,
node 0 is SIGKILLed: how long the cluster committed nothing (a probe commits through
node 2 every 10 ms), when the instance on node 0 logged its move, when it checkpointed
again, and how long node 0 takes to rejoin (``--wsrep-recover``, IST). Every read model
is compared with the replay on every node; a difference fails the benchmark.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "support")]

from clusters import lag, start_instance, stop_instance, wait_until, write_config  # noqa: E402
from galera_cluster import (  # noqa: E402
    GCOMM_OFFSETS,
    SQL_OFFSETS,
    GaleraCluster,
    free_port_base,
)
from galera_ledger import (  # noqa: E402
    applying,
    cluster_database,
    every_node_matches_replay,
    ledger_lines,
    message_count,
)
from private_mariadb import PrivateMariaDB  # noqa: E402
from sqlalchemy import text  # noqa: E402

from messaging import Database  # noqa: E402
from messaging.store._migrations import migrate  # noqa: E402
from projections._appending import append_lines  # noqa: E402

SAME_INNODB = ["--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=2"]
"""The cluster's nodes run with these too (durability comes from the other nodes)."""


APPEND = [sys.executable, "-m", "projections.cli", "append"]


class BenchmarkFailure(Exception):
    """A read model differs from the replay, or a step never completed."""


def _append_rates(urls: list[str], tmp: Path, messages: int) -> tuple[float, float]:
    """(messages/s of one in-process writer through urls[0], of three CLI writers)."""
    one = tmp / "one.jsonl"
    count = ledger_lines(one, seed=1, messages=messages, prefix="one")
    db = Database(urls[0])
    started = time.perf_counter()
    with one.open(encoding="utf-8") as stream:
        append_lines(db, stream, batch_size=100)
    single = count / (time.perf_counter() - started)
    db.dispose()
    files = [tmp / f"three-{n}.jsonl" for n in range(3)]
    total = sum(
        ledger_lines(path, seed=2 + n, messages=messages // 3, prefix=f"w{n}")
        for n, path in enumerate(files)
    )
    started = time.perf_counter()
    writers = [
        subprocess.Popen(
            [*APPEND, str(path), "--database", urls[n % len(urls)], "--batch-size", "100"],
            stdout=subprocess.DEVNULL,
        )
        for n, path in enumerate(files)
    ]
    if [w.wait() for w in writers] != [0, 0, 0]:
        raise BenchmarkFailure("a concurrent projections append failed")
    return single, total / (time.perf_counter() - started)


def _apply_rate(urls: list[str], tmp: Path) -> float:
    """Messages/s two instances (on urls[0], urls[1]) apply catching up from scratch."""
    db = Database(urls[0])
    total = message_count(db)
    instances = []
    for n in range(2):
        config = write_config(tmp / f"apply-{n}.yaml", Database(urls[n]), batch_size=500)
        instances.append(start_instance(config, f"apply-{n}", log=tmp / f"apply-{n}.log"))
    wait_until(lambda: (lag(db) or total) < total, timeout=60, what="the first checkpoint")
    first, remaining = time.perf_counter(), lag(db) or 0
    wait_until(lambda: lag(db) == 0, timeout=300, what="the instances to catch up")
    rate = remaining / (time.perf_counter() - first)
    if [stop_instance(p) for p in instances] != [0, 0]:
        raise BenchmarkFailure("an instance did not stop cleanly")
    db.dispose()
    return rate


def _handover(cluster: GaleraCluster, name: str, tmp: Path) -> dict[str, float]:
    """Seconds from SIGKILLing node 0 to each step of the recovery."""
    db = Database(cluster.multi_url(name, [2, 1]))
    logs = [tmp / f"node-{n}.log" for n in range(2)]
    instances = [
        start_instance(
            write_config(tmp / f"node-{n}.yaml", Database(cluster.multi_url(name, order))),
            f"on-node{n}",
            log=logs[n],
        )
        for n, order in enumerate([[0, 1, 2], [1, 2, 0]])
    ]
    wait_until(lambda: lag(db) == 0, timeout=120, what="the instances to catch up")
    traffic = tmp / "traffic.jsonl"
    ledger_lines(traffic, seed=9, messages=4000, prefix="h")
    stop = threading.Event()
    gaps: list[float] = []

    def feed() -> None:
        appender = Database(cluster.url(2, name))
        with traffic.open(encoding="utf-8") as stream:
            for line in stream:
                if stop.is_set():
                    break
                append_lines(appender, [line])
                time.sleep(0.005)
        appender.dispose()

    def probe() -> None:
        engine = Database(cluster.url(2, name)).engine
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE probe (id INT PRIMARY KEY, n BIGINT NOT NULL)"))
            conn.execute(text("INSERT INTO probe VALUES (1, 0)"))
        last = time.perf_counter()
        while not stop.is_set():
            with engine.begin() as conn:  # a commit replicated to every node
                conn.execute(text("UPDATE probe SET n = n + 1"))
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            time.sleep(0.01)
        engine.dispose()

    threads = [threading.Thread(target=feed), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    time.sleep(2)  # steady traffic before the kill: a measurement, not a synchronisation
    killed = time.perf_counter()
    gaps.clear()
    cluster.kill_node(0)
    wait_until(lambda: "now using" in logs[0].read_text(), timeout=30, what="the move")
    moved = time.perf_counter() - killed
    wait_until(applying(db, "on-node0"), timeout=30, what="node 0's instance to apply")
    resumed = time.perf_counter() - killed
    cluster.restart_node(0)
    rejoined = time.perf_counter() - killed
    stop.set()
    for thread in threads:
        thread.join()
    wait_until(lambda: lag(db) == 0, timeout=120, what="the instances to catch up")
    if [stop_instance(p) for p in instances] != [0, 0]:
        raise BenchmarkFailure("an instance did not stop cleanly")
    db.dispose()
    return {"stall": max(gaps), "move": moved, "resumed": resumed, "rejoined": rejoined}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=9000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="galera-bench-") as directory:
        tmp = Path(directory)
        single = PrivateMariaDB(tmp / "single", args=SAME_INNODB)
        cluster = GaleraCluster(
            tmp / "cluster",
            sql_port=free_port_base(25406, SQL_OFFSETS),
            gcomm_port=free_port_base(25567, GCOMM_OFFSETS),
        )
        try:
            single.start()
            single.execute("CREATE DATABASE bench CHARACTER SET utf8mb4")
            cluster.start()
            results = {}
            bench = Database(single.url("bench"))
            migrate(bench)
            bench.prepare()
            bench.dispose()
            (tmp / "s").mkdir()
            results["single server"] = (
                *_append_rates([single.url("bench")], tmp / "s", args.messages),
                _apply_rate([single.url("bench")] * 2, tmp / "s"),
            )
            with cluster_database(cluster) as name:
                (tmp / "g").mkdir()
                urls = [cluster.url(n, name) for n in range(3)]
                results["galera, 3 nodes"] = (
                    *_append_rates(urls, tmp / "g", args.messages),
                    _apply_rate(urls, tmp / "g"),
                )
                if not wait_until(
                    lambda: every_node_matches_replay(cluster, name), timeout=60, what="nodes"
                ):
                    raise BenchmarkFailure("a node's read model differs from the replay")
            with cluster_database(cluster) as name:
                (tmp / "h").mkdir()
                handover = _handover(cluster, name, tmp / "h")
                if not wait_until(
                    lambda: every_node_matches_replay(cluster, name), timeout=60, what="nodes"
                ):
                    raise BenchmarkFailure("a node's read model differs from the replay")
        finally:
            cluster.destroy()
            single.stop()
    print(f"{'':18}{'append 1 writer':>18}{'append 3 writers':>18}{'apply 2 instances':>19}")
    for label, (one, three, apply) in results.items():
        print(f"{label:18}{one:>14,.0f} m/s{three:>14,.0f} m/s{apply:>15,.0f} m/s")
    base = results["single server"]
    ratios = [g / s for g, s in zip(results["galera, 3 nodes"], base, strict=True)]
    print("galera / single   " + "".join(f"{r:>18.2f}" for r in ratios))
    print(
        f"node 0 SIGKILLed: nothing committed for {handover['stall']:.1f}s; its instance "
        f"logged its move after {handover['move']:.1f}s and checkpointed again after "
        f"{handover['resumed']:.1f}s; node 0 rejoined (recover + IST) after "
        f"{handover['rejoined']:.1f}s; read models equal the replay on every node"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
