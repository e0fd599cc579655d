"""A slow batch holds only its own partitions, and a frozen owner cannot hold up the
cluster: real instance processes on MariaDB, with handlers held inside their batches by
files the test controls (``gate_app``)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import gate_app
import pytest
from clusters import owners, start_instance, stop_instance, wait_until
from forked import Process
from sqlalchemy import MetaData, Select, func, select

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from messaging.store._rows import partition_of
from projections._reports import consumers_report

pytestmark = [pytest.mark.mysql, pytest.mark.multiprocess]

CONFIG = """\
database: {url}
table-prefix: {prefix}
messaging:
  consumer:
    rebalance-interval: 500ms
    stale-instance-timeout: {stale}s
    heartbeat-interval: 300ms
    graceful-shutdown-timeout: 3s
    idle-poll-interval: 50ms
    batch-size: 50
    conflict-retry: {{max-retries: 5, max-delay: 100ms}}
"""
STALE = 2.0


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [gate_app.metadata]


class Cluster:
    """``gate_app`` instance processes, their gate files in one folder."""

    def __init__(self, db: Database, folder: Path) -> None:
        self.db, self.folder = db, folder
        self.gates = folder / "gates"
        self.gates.mkdir()
        self.config = folder / "config.yaml"
        self.config.write_text(
            CONFIG.format(url=db.url, prefix=db.schema.prefix, stale=STALE), encoding="utf-8"
        )
        self.processes: dict[str, Process] = {}

    def start(self, name: str) -> None:
        self.processes[name] = start_instance(
            self.config,
            name,
            "gate_app",
            env={"GATE_DIR": str(self.gates)},
            log=self.folder / f"{name}.log",
        )

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(encoding="utf-8")

    def owned(self, consumer: str) -> dict[int, str]:
        """Partition → its owner's name ("" when none)."""
        return {p: name or "" for p, (name, _) in owners(self.db, consumer).items()}

    def shares(self, consumer: str) -> list[str]:
        return sorted(self.owned(consumer).values())

    def append(self, topic: str, messages: Mapping[str, object]) -> None:
        """Append one message per source."""
        store = MessageStore(self.db)
        with self.db.transaction() as conn:
            for source, message in messages.items():
                store.append(conn, topic, source, [message])

    def count(self, query: Select[Any]) -> int:
        with self.db.read() as conn:
            return int(conn.execute(query).scalar_one())

    def healthy(self) -> bool:
        """Every consumer caught up, nothing halted."""
        report = consumers_report(self.db, ConsumerSettings(stale_instance_timeout=STALE))
        partitions = [p for c in report["consumers"] for p in c["partitions"]]
        assert all(p["state"] != "HALTED" for p in partitions), partitions
        return bool(partitions) and all(p["lag"] == 0 for p in partitions)


@pytest.fixture
def cluster(db: Database, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(db, tmp_path)
    try:
        yield running
    finally:
        (running.gates / "thaw").touch()
        for n in range(gate_app.PARTITIONS):
            (running.gates / f"open-{n}").touch()
        for process in running.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                stop_instance(process)


def _source_in(partition: int) -> str:
    sources = (f"s{n}" for n in range(1000))
    return next(s for s in sources if partition_of(s, gate_app.PARTITIONS) == partition)


def test_a_slow_batch_holds_only_its_own_partitions(cluster: Cluster) -> None:
    """Every partition of gate-slow is held inside a batch when b joins: gate-quick is
    shared at once all the same, and each partition of gate-slow that moves is released
    right after its own batch commits, not before, not after the others'."""
    cluster.start("a")
    wait_until(
        lambda: (
            set(cluster.owned("gate-slow").values()) == {"a"}
            and set(cluster.owned("gate-quick").values()) == {"a"}
        ),
        timeout=60,
        what="a owning everything",
    )
    # One transaction: the first read finds every lane busy (a lane without messages would
    # ride along with another lane's batch, to move its checkpoint, and wait with it).
    gated = {_source_in(p): gate_app.Item(str(p)) for p in range(gate_app.PARTITIONS)}
    cluster.append("gate-slow", gated)
    wait_until(
        lambda: all((cluster.gates / f"inside-{p}").exists() for p in range(gate_app.PARTITIONS)),
        timeout=30,
        what="a batch of every partition of gate-slow held inside its handler",
    )
    cluster.start("b")
    wait_until(
        lambda: cluster.shares("gate-quick") == ["a", "a", "b", "b"],
        timeout=30,
        what="gate-quick shared while the slow batches run",
    )
    assert set(cluster.owned("gate-slow").values()) == {"a"}, "released before its batch ended"
    applied = select(func.count()).select_from(gate_app.applied)
    moved = []
    for partition in range(gate_app.PARTITIONS):
        (cluster.gates / f"open-{partition}").touch()
        wait_until(
            partial(lambda n: cluster.count(applied) == n, partition + 1),
            timeout=30,
            what=f"the batch of partition {partition} committed",
        )
        committed = time.monotonic()
        while time.monotonic() - committed < 2.0:  # a moving partition is b's by then
            if cluster.owned("gate-slow")[partition] == "b":
                moved.append(partition)
                break
            time.sleep(0.02)
        later = range(partition + 1, gate_app.PARTITIONS)
        assert all(cluster.owned("gate-slow")[p] == "a" for p in later), cluster.owned("gate-slow")
    assert len(moved) == 2, moved
    wait_until(
        lambda: cluster.shares("gate-slow") == ["a", "a", "b", "b"],
        timeout=30,
        what="gate-slow shared",
    )
    items = {_source_in(p): gate_app.Item() for p in range(gate_app.PARTITIONS)}
    cluster.append("gate-slow", items)
    cluster.append("gate-quick", items)
    wait_until(cluster.healthy, timeout=30, what="every message applied")
    assert cluster.count(applied) == 3 * gate_app.PARTITIONS  # each once (position is the key)


KEYS = [f"k{n}" for n in range(12)]


def test_a_frozen_owner_holds_up_nobody_and_its_late_commit_fails(cluster: Cluster) -> None:
    """The owner of a key's partition is SIGSTOPped inside a batch that holds the key's row
    lock, under traffic: within stale-instance-timeout + 2 s every message appended up to
    half a second after the freeze is applied by the survivors (the new owner ended the
    frozen instance's sessions, so the lock went); woken, the frozen instance's commit
    fails, and every message is applied once."""
    for name in ("a", "b", "c"):
        cluster.start(name)
    cluster.append("gate-totals", {key: gate_app.Opened(key) for key in KEYS})
    wait_until(
        lambda: len(set(cluster.owned("gate-totals").values()) - {""}) == 3 and cluster.healthy(),
        timeout=60,
        what="gate-totals spread over three instances",
    )
    time.sleep(1.0)  # a few heartbeats, so that each instance has recorded its sessions
    stop = threading.Event()
    rounds: list[int] = []
    writer = threading.Thread(target=_traffic, args=(cluster, stop, rounds))
    writer.start()
    try:
        cluster.append("gate-totals", {KEYS[0]: gate_app.Freeze(KEYS[0])})
        frozen = wait_until(
            lambda: next(cluster.gates.glob("frozen-*"), None), timeout=30, what="the freeze"
        )
        pid = int(frozen.name.split("-")[1])
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(0.5)  # traffic goes on: what it appends now must be applied too
        target = cluster.count(select(func.max(cluster.db.schema.messages.c.position)))
        expected = _counted(cluster, target)
        wait_until(
            lambda: _applied(cluster, target) == expected,
            timeout=STALE + 2.0 - (time.monotonic() - stopped),
            what="the survivors caught up within stale-instance-timeout + 2 s",
        )
        recovered = time.monotonic() - stopped
    finally:
        stop.set()
        writer.join()
    (cluster.gates / "thaw").touch()
    os.kill(pid, signal.SIGCONT)
    wait_until(cluster.healthy, timeout=60, what="every message applied")
    with cluster.db.read() as conn:
        totals = dict(conn.execute(select(gate_app.totals.c.key, gate_app.totals.c.n)).all())
    assert cluster.count(select(func.count()).select_from(gate_app.counted)) == len(rounds) * len(
        KEYS
    )
    assert totals == {k: len(rounds) + (1000 if k == KEYS[0] else 0) for k in KEYS}
    [name] = [n for n, p in cluster.processes.items() if p.pid == pid]
    assert "ended" in "".join(cluster.log(n) for n in cluster.processes if n != name)
    print(f"\nsurvivors caught up {recovered:.2f} s after {name} was frozen (bound {STALE + 2} s)")


def _traffic(cluster: Cluster, stop: threading.Event, rounds: list[int]) -> None:
    while not stop.is_set():
        cluster.append("gate-totals", {key: gate_app.Counted(key) for key in KEYS})
        rounds.append(1)
        stop.wait(0.05)


def _counted(cluster: Cluster, through: int) -> int:
    m = cluster.db.schema.messages
    return cluster.count(
        select(func.count()).where(m.c.type == "test.gate.counted", m.c.position <= through)
    )


def _applied(cluster: Cluster, through: int) -> int:
    c = gate_app.counted.c
    return cluster.count(select(func.count()).where(c.position <= through))
