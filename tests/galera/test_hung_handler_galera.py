"""A hung handler on a 3-node Galera cluster: two instances, one through node 0 and one
through node 1, the messages appended through node 2. The handler of one source sleeps
6 s past ``apply-timeout: 1500ms``: its partition halts at its message, every other
partition (those of its instance's batch too) is applied within the timeout plus 2 s,
once each, and the hung handler is not run again (tests/integration/test_apply_timeout.py
on one server)."""

from __future__ import annotations

from pathlib import Path

import parked_seq_app as app
import pytest
from clusters import owned_by, start_instance, stop_instance, wait_until, write_config
from galera_cluster import GaleraCluster

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from messaging.store._rows import partition_of
from projections._reports import consumers_report

pytestmark = [pytest.mark.galera, pytest.mark.mysql, pytest.mark.multiprocess]

SOURCES = [f"s-{n}" for n in range(12)]
SLOW = "s-3"


def _append(db: Database, seq: int, sources: list[str]) -> None:
    store = MessageStore(db)
    with db.transaction() as conn:
        for source in sources:
            store.append(conn, "seq", source, [app.Step(seq)])


def _halted(db: Database) -> list[int]:
    report = consumers_report(db, ConsumerSettings())
    entry = next(c for c in report["consumers"] if c["name"] == "parked-seq")
    return [p["partition"] for p in entry["partitions"] if "halted" in p]


def test_a_hung_handler_on_one_node_holds_only_its_partition(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    nodes = [Database(galera.url(node, galera_db)) for node in range(3)]
    writer = nodes[2]
    with nodes[0].transaction() as conn:
        app.metadata.create_all(conn)
    extra = "projections:\n  apply-timeout: 1500ms\n"  # above the lock-wait bound (1 s)
    started = tmp_path / "started"
    env = {"STUCK_STARTED": str(started), "STUCK_SOURCE": SLOW, "STUCK_SECONDS": "6"}
    processes = [
        start_instance(
            write_config(tmp_path / f"node{n}.yaml", nodes[n], batch_size=20, extra=extra),
            f"g{n}",
            "parked_seq_app",
            env=env,
        )
        for n in (0, 1)
    ]
    slow = partition_of(SLOW, 4)
    others = [s for s in SOURCES if partition_of(s, 4) != slow]
    try:
        wait_until(
            lambda: owned_by(writer, {"g0", "g1"}, "parked-seq"), timeout=60, what="two owners"
        )
        _append(writer, 1, SOURCES)
        began = wait_until(
            lambda: started.exists() and float(started.read_text().split()[0]),
            timeout=30,
            what="the slow handler",
        )
        _append(writer, 2, others)
        took = app.applied_within(writer, others, [1, 2], began)
        assert took < 1.5 + 2, f"the other partitions waited {took:.2f} s for the hung one"
        wait_until(lambda: _halted(writer) == [slow], timeout=30, what="the halt")
        assert SLOW not in app.applied_seqs(writer)
        for process in processes:  # (one waits for its hung handler to return, or not)
            assert stop_instance(process) == 0
        assert len(started.read_text().split()) == 1  # handled once, never again
        assert _halted(writer) == [slow] and SLOW not in app.applied_seqs(writer)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for db in nodes:
            db.dispose()
