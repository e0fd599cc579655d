"""High availability on a 3-node MariaDB Galera cluster (started by tests/galera/conftest.py):
instances on different nodes, concurrent appends through every node, a node SIGKILLed
under traffic and restarted, lost acknowledgements in front of one node. Every read model
equals the sequential replay on every node: nothing lost, nothing applied twice."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ack_proxy import AckProxy
from clusters import lag, owned_by, start_instance, stop_instance, wait_until
from galera_cluster import GaleraCluster
from galera_ledger import (
    MOVED,
    applying,
    checkpoints,
    every_node_matches_replay,
    instance_config,
    ledger_lines,
    message_count,
)

from messaging import Database
from messaging._settings import ConflictRetrySettings, ConsumerSettings
from projections._appending import append_lines
from projections._reports import consumers_report

pytestmark = [pytest.mark.galera, pytest.mark.mysql, pytest.mark.multiprocess]

APPEND = [sys.executable, "-m", "projections.cli", "append"]


def _config(tmp_path: Path, name: str, url: str) -> Path:
    return instance_config(tmp_path / f"{name}.yaml", url, batch_size=50)


def _append(config_url: str, path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*APPEND, str(path), "--database", config_url, "--batch-size", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _conflicts(cluster: GaleraCluster) -> int:
    """Certification failures and brute-force aborts counted by the nodes so far."""
    total = 0
    for node in range(cluster.size):
        status = cluster.status(node) or {}
        total += int(status.get("wsrep_local_cert_failures", 0))
        total += int(status.get("wsrep_local_bf_aborts", 0))
    return total


def _caught_up(db: Database) -> bool:
    return lag(db) == 0


def _claims(db: Database, settings: ConsumerSettings) -> set[tuple[int, int, str]]:
    """(partition, epoch, owner) of every partition, as ``status`` shows them."""
    return {
        (p["partition"], p["epoch"], str(p["instance"]))
        for entry in consumers_report(db, settings)["consumers"]
        for p in entry["partitions"]
    }


def _both_own(db: Database, names: set[str]) -> bool:
    owners = owned_by(db, names)
    return owners is not None and set(owners.values()) == names


def test_instances_on_different_nodes_with_appends_through_every_node(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    """Instance A on node 0, B on node 1; three ``projections append`` at once through the
    three nodes, whose certification conflicts (1213 at COMMIT) are retried: every line is
    stored once, every node's read model equals the replay."""
    db = Database(galera.multi_url(galera_db))
    names = {"on-node0", "on-node1"}
    instances = [
        start_instance(
            _config(tmp_path, name, galera.multi_url(galera_db, order)),
            name,
            log=tmp_path / f"{name}.log",
        )
        for name, order in [("on-node0", [0, 1, 2]), ("on-node1", [1, 2, 0])]
    ]
    wait_until(lambda: _both_own(db, names), timeout=30, what="both instances to own partitions")
    conflicts_before = _conflicts(galera)
    # Rounds of three appenders at once until their commits collided (whether processes
    # started apart overlap at all is up to the machine): at most five rounds.
    lines: list[int] = []
    for round_no in range(5):
        files = [tmp_path / f"traffic-{round_no}-{node}.jsonl" for node in range(3)]
        sizes = [
            ledger_lines(
                path, seed=10 * round_no + node, messages=600, prefix=f"r{round_no}n{node}"
            )
            for node, path in enumerate(files)
        ]
        appenders = [_append(galera.url(node, galera_db), files[node]) for node in range(3)]
        results = [process.communicate(timeout=120) for process in appenders]
        assert [p.returncode for p in appenders] == [0, 0, 0], results
        assert [out.splitlines()[0] for out, _ in results] == [
            f"appended {n} messages" for n in sizes
        ]
        lines += sizes
        if _conflicts(galera) > conflicts_before:
            break
    conflicts = _conflicts(galera) - conflicts_before
    wait_until(lambda: _caught_up(db), timeout=60, what="the instances to catch up")
    assert [stop_instance(process) for process in instances] == [0, 0]
    assert message_count(db) == sum(lines)
    assert wait_until(
        lambda: every_node_matches_replay(galera, galera_db), timeout=30, what="every node"
    )
    print(
        f"\n{sum(lines)} lines through 3 nodes at once in {len(lines) // 3} round(s); "
        f"{conflicts} certification conflicts"
    )
    assert conflicts > 0  # the appends did collide, and their retries succeeded
    for name in names:
        log = (tmp_path / f"{name}.log").read_text()
        assert "Traceback" not in log, log


class _KillRun:
    """Instance ``on-node0`` on node 0 (then 1, 2), ``on-node1`` on node 1 (then 2, 0),
    ``stale`` their stale-instance-timeout, and ledger traffic appended through node 2 by a
    thread until :meth:`finish`."""

    names = frozenset({"on-node0", "on-node1"})

    def __init__(self, galera: GaleraCluster, database: str, tmp_path: Path, stale: str) -> None:
        self.galera, self.database = galera, database
        self.db = Database(galera.multi_url(database, [2, 1, 0]))
        self.logs = {name: tmp_path / f"{name}.log" for name in self.names}
        self.instances = [
            start_instance(self._config(tmp_path, name, order, stale), name, log=self.logs[name])
            for name, order in [("on-node0", [0, 1, 2]), ("on-node1", [1, 2, 0])]
        ]
        wait_until(self.both_own, timeout=30, what="both instances to own partitions")
        traffic = tmp_path / "traffic.jsonl"
        self.lines = ledger_lines(traffic, seed=7, messages=3000, prefix="k")
        appender = Database(galera.url(2, database))
        self.appended: list[int] = []
        self.extra = 0
        """Lines appended besides the thread's traffic."""
        self.cut = False
        """Whether node 0 is isolated (:meth:`GaleraCluster.isolate`)."""
        retry = ConflictRetrySettings(max_retries=20, max_delay=0.5)

        def append() -> None:
            with traffic.open(encoding="utf-8") as stream:
                self.appended.append(append_lines(appender, stream, batch_size=10, retry=retry))

        self.thread = threading.Thread(target=append)
        self.thread.start()
        wait_until(lambda: message_count(self.db) > 500, timeout=30, what="traffic")

    def _config(self, tmp_path: Path, name: str, order: list[int], stale: str) -> Path:
        path = _config(tmp_path, name, self.galera.multi_url(self.database, order))
        text = path.read_text(encoding="utf-8")
        path.write_text(
            text.replace("stale-instance-timeout: 1s", f"stale-instance-timeout: {stale}")
        )
        return path

    def __enter__(self) -> _KillRun:
        return self

    def __exit__(self, failed: type[BaseException] | None, *_exc: object) -> None:
        self.stop()
        if failed is not None:  # what the instances said (warnings), for the failure's report
            for name in sorted(self.names):
                print(f"--- {name}'s log, the last 40 lines:")
                print("\n".join(self.log(name).splitlines()[-40:]))

    def both_own(self) -> bool:
        return _both_own(self.db, set(self.names))

    def log(self, name: str) -> str:
        return self.logs[name].read_text()

    def moves(self, name: str) -> list[str]:
        return [line for line in self.log(name).splitlines() if MOVED in line]

    def finish(self) -> float:
        """Node 0 back, the traffic all appended and applied, every message once and every
        node's read model equal to the replay; returns when node 0 was back (monotonic)."""
        if not self.galera.running(0):
            self.galera.restart_node(0)
        rejoined = time.monotonic()
        self.thread.join(timeout=120)
        assert self.appended == [self.lines]
        wait_until(lambda: _caught_up(self.db), timeout=60, what="the instances to catch up")
        assert [stop_instance(process) for process in self.instances] == [0, 0]
        assert message_count(self.db) == self.lines + self.extra
        assert wait_until(
            lambda: every_node_matches_replay(self.galera, self.database),
            timeout=30,
            what="every node",
        )
        return rejoined

    def stop(self) -> None:
        """Stop the instances and the traffic, and end node 0's isolation (a test that
        failed)."""
        if self.cut:
            self.galera.isolate(0, False)  # the next test's fixture waits for its rejoin
        for process in self.instances:
            if process.poll() is None:
                process.kill()
        self.thread.join(timeout=120)


def test_node_killed_under_traffic_moves_its_instance_and_loses_nothing(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    """Node 0 is SIGKILLed while messages are appended through node 2: the instance on it
    moves to a live node (one log line) and keeps its share within stale-instance-timeout
    (1 s) + a few seconds; the node restarts (recover, IST) and every node ends equal to
    the replay, every message stored once."""
    with _KillRun(galera, galera_db, tmp_path, stale="1s") as run:
        killed = time.monotonic()
        galera.kill_node(0)
        before = checkpoints(run.db, "on-node0")  # all it committed: it commits nothing dead
        wait_until(lambda: run.moves("on-node0"), timeout=15, what="the move")
        moved = time.monotonic() - killed
        wait_until(
            applying(run.db, "on-node0", before), timeout=15, what="node 0's instance to apply"
        )
        resumed = time.monotonic() - killed
        wait_until(run.both_own, timeout=15, what="both instances to own")
        owning = time.monotonic() - killed
        moves = run.moves("on-node0")  # before node 0 rejoins (its IST pauses commits too)
        rejoined = run.finish() - killed
    print(
        f"\nnode 0 killed: its instance moved after {moved:.1f}s, checkpointed again after "
        f"{resumed:.1f}s, both instances own partitions after {owning:.1f}s, node 0 "
        f"rejoined after {rejoined:.1f}s"
    )
    assert resumed < 1 + 6  # stale-instance-timeout + Galera's eviction of the dead node
    # One move; or two when a statement on the first live node outlasted the answer bound
    # (2 s with this stale-instance-timeout of 1 s) while the cluster evicted node 0 (~3 s).
    assert 1 <= len(moves) <= 2, moves
    node = galera.sql_ports.index(int(moves[-1].rsplit(":", 1)[1]))
    assert int((galera.status(node) or {})["wsrep_causal_reads"]) > 0  # read-your-writes
    assert "Traceback" not in run.log("on-node0") + run.log("on-node1")


def test_node_killed_with_stale_timeout_above_the_eviction_reshuffles_nothing(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    """The README's advice (stale-instance-timeout well above Galera's suspect timeout,
    here 8 s against 2 s): while the cluster commits nothing until it evicts the killed
    node, ``status`` never shows a partition ORPHANED or UNCLAIMED, no partition changes
    hands (no ``lost`` event, no session of a peer ended), only the instance on node 0
    moves (one line), and it applies again under the same claims."""
    settings = ConsumerSettings(stale_instance_timeout=8.0)
    with _KillRun(galera, galera_db, tmp_path, stale="8s") as run:
        claims = _claims(run.db, settings)
        seen: set[str] = set()
        reports: list[float] = []
        watching = threading.Event()

        def watch() -> None:  # what `projections status` shows, every 50 ms
            while not watching.is_set():
                for entry in consumers_report(run.db, settings)["consumers"]:
                    seen.update(str(p["state"]) for p in entry["partitions"])
                reports.append(time.monotonic())
                watching.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            killed = time.monotonic()
            galera.kill_node(0)
            before = checkpoints(run.db, "on-node0")
            wait_until(lambda: run.moves("on-node0"), timeout=15, what="the move")
            wait_until(
                applying(run.db, "on-node0", before),
                timeout=15,
                what="node 0's instance to apply",
            )
            resumed = time.monotonic() - killed
        finally:
            watching.set()
            watcher.join()
        after = _claims(run.db, settings)
        moves = {name: run.moves(name) for name in ("on-node0", "on-node1")}  # before the IST
        run.finish()
    print(f"\nstale-instance-timeout 8s: node 0's instance checkpointed again after {resumed:.1f}s")
    assert seen == {"OWNED"}, seen
    assert reports[-1] - killed >= resumed - 0.5  # the watcher saw the whole pause
    assert after == claims  # the same claims: nothing taken over
    assert resumed < 8
    assert len(moves["on-node0"]) == 1 and moves["on-node1"] == [], moves
    records = [line for line in run.log("on-node0").splitlines() if line.startswith("20")]
    assert len(records) <= 8, records  # quiet: a few lines, not one per failed attempt
    logs = run.log("on-node0") + run.log("on-node1")
    assert "event=lost" not in logs and "stale instance" not in logs and "Traceback" not in logs, (
        logs
    )


def test_lost_acknowledgements_in_front_of_one_node(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    """The lost-acknowledgement proxy in front of node 1: instance B and one appender talk
    to node 1 through it while A runs on node 0 and another appender writes through node 2.
    Commits whose acknowledgement is lost are never applied or stored twice."""
    db = Database(galera.multi_url(galera_db, [2, 0, 1]))
    proxy = AckProxy(("127.0.0.1", galera.sql_ports[1]), seed=3)
    proxy.probability = 0.05
    proxied = f"mysql+pymysql://root@127.0.0.1:{proxy.port}/{galera_db}"
    names = {"on-node0", "behind-proxy"}
    try:
        instances = [
            start_instance(_config(tmp_path, name, url), name, log=tmp_path / f"{name}.log")
            for name, url in [
                ("on-node0", galera.multi_url(galera_db, [0, 2])),
                ("behind-proxy", proxied),
            ]
        ]
        wait_until(lambda: _both_own(db, names), timeout=30, what="both instances to own")
        files = [tmp_path / f"traffic-{n}.jsonl" for n in range(2)]
        lines = [
            ledger_lines(path, seed=10 + n, messages=800, prefix=f"p{n}")
            for n, path in enumerate(files)
        ]
        appenders = [_append(proxied, files[0]), _append(galera.url(2, galera_db), files[1])]
        results = [process.communicate(timeout=120) for process in appenders]
        assert [p.returncode for p in appenders] == [0, 0], results
        wait_until(lambda: _caught_up(db), timeout=60, what="the instances to catch up")
        proxy.probability = 0.0
        assert [stop_instance(process) for process in instances] == [0, 0]
    finally:
        proxy.close()
    print(f"\nlost acknowledgements: {proxy.dropped} of {proxy.commits} commits through node 1")
    assert proxy.dropped > 0
    assert message_count(db) == sum(lines)
    assert wait_until(
        lambda: every_node_matches_replay(galera, galera_db), timeout=30, what="every node"
    )


def test_node_out_of_the_primary_component_is_passed_over(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    """Node 0 is cut off from the others (``gmcast.isolate``) under traffic, its server
    running: once evicted it answers 1047 (not in the primary component). The instance on
    it moves to a live node (one line naming the error) and applies again; a ``projections
    append`` given all nodes, node 0 first, skips it (``wsrep_ready=OFF``) and stores its
    file once. Node 0 rejoins by itself and ends equal to the replay like the others.

    Moves are counted while node 0 is cut off: its rejoin pauses the cluster's commits
    again, on a loaded host for longer than the answer bound (5 s here, the eviction
    time), and an instance then leaves a node that did not answer, as it should."""
    with _KillRun(galera, galera_db, tmp_path, stale="8s") as run:
        cut = time.monotonic()
        galera.isolate(0)
        run.cut = True
        before = checkpoints(run.db, "on-node0")  # node 0 commits nothing once cut off
        wait_until(
            lambda: (galera.status(0) or {}).get("wsrep_ready") == "OFF",
            timeout=30,
            what="node 0 out of the primary component",
        )
        wait_until(lambda: run.moves("on-node0"), timeout=15, what="the move")
        # More to apply after the move, whether or not the traffic has ended by then.
        run.extra = ledger_lines(tmp_path / "cut.jsonl", seed=8, messages=200, prefix="c")
        appender = _append(galera.multi_url(galera_db), tmp_path / "cut.jsonl")
        wait_until(
            applying(run.db, "on-node0", before), timeout=15, what="node 0's instance to apply"
        )
        resumed = time.monotonic() - cut
        out, err = appender.communicate(timeout=60)
        assert (appender.returncode, out.splitlines()[0]) == (
            0,
            f"appended {run.extra} messages",
        ), err
        assert "1047" not in err and "1180" not in err, err  # node 0 was skipped, not tried
        moves = run.moves("on-node0")
        assert len(moves) == 1 and run.moves("on-node1") == [], moves
        galera.isolate(0, False)
        run.cut = False
        galera.wait_synced(0, cluster_size=3)
        run.finish()
    print(f"\nnode 0 cut off: its instance applied again after {resumed:.1f}s")
    assert any(reason in moves[0] for reason in ("1047", "1180", "wsrep_ready=OFF")), moves
    assert not moves[0].endswith(f":{galera.sql_ports[0]}")
    logs = run.log("on-node0") + run.log("on-node1")
    assert "event=lost" not in logs and "Traceback" not in logs, logs
