"""Real processes, both backends: a batch that outlasts its consumer's ``apply-timeout``
fails within the bound plus one second (a handler sleeping in Python as it returns, a
statement that would never end by being interrupted), is rolled back and halts its
partition (or parks its source) with the reason "apply timeout (3s) exceeded at position
N"; the consumer's other partitions keep moving."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import parked_seq_app as app
import pytest
from clusters import start_instance, stop_instance, wait_until, write_config
from health_app import free_port, probe
from sqlalchemy import MetaData

from messaging import Database, MessageStore
from messaging._config import load_settings
from messaging._settings import ConsumerSettings
from messaging.store._rows import partition_of
from projections._health import health_report
from projections._parked_ops import parked
from projections._reports import consumers_report

pytestmark = pytest.mark.multiprocess

SOURCES = [f"s-{n}" for n in range(12)]
SLOW = "s-3"
BOUND = 3.0
SLACK = 0.5
"""Seconds for the halt (or park) to commit after the batch failed, and for this test to
see it (a poll of the database)."""


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [app.metadata]


def _append(db: Database, seqs: range, sources: list[str]) -> dict[str, int]:
    """Append ``seqs`` of each source; return the position of each source's first."""
    store = MessageStore(db)
    first: dict[str, int] = {}
    with db.transaction() as conn:
        for seq in seqs:
            for source in sources:
                position = store.append(conn, "seq", source, [app.Step(seq)])[0]
                first.setdefault(source, position)
    return first


def _halted(db: Database) -> dict[int, Any]:
    report = consumers_report(db, ConsumerSettings())
    entry = next(c for c in report["consumers"] if c["name"] == "parked-seq")
    return {p["partition"]: p["halted"] for p in entry["partitions"] if "halted" in p}


def _started(path: Path) -> float:
    return float(path.read_text().split()[0]) if path.exists() and path.read_text() else 0.0


def _start(db: Database, tmp_path: Path, extra: str, env: dict[str, str]) -> Any:
    """An instance whose statements may wait 4 s for the server (the answer bound: twice
    the lock-wait bound, stale-instance-timeout / 4), longer than the apply timeout: a
    statement past the answer bound would fail as a lost connection, and be retried."""
    with db.transaction() as conn:
        app.metadata.create_all(conn)
    timing = {"stale-instance-timeout": "8s"}
    config = write_config(tmp_path / "config.yaml", db, batch_size=20, extra=extra, consumer=timing)
    started = tmp_path / "started"
    return start_instance(
        config, "t1", "parked_seq_app", env={"STUCK_STARTED": str(started), **env}
    )


def _others_move(db: Database, seqs: range) -> None:
    """The sources outside the slow source's partition get ``seqs`` too (after 1, 2, 3)."""
    others = [s for s in SOURCES if partition_of(s, 4) != partition_of(SLOW, 4)]
    _append(db, seqs, others)
    wait_until(
        lambda: all(app.applied_seqs(db).get(s) == list(range(1, seqs.stop)) for s in others),
        timeout=30,
        what="the other partitions",
    )


def test_a_handler_sleeping_past_the_timeout_halts_its_partition(
    db: Database, tmp_path: Path
) -> None:
    extra = "projections:\n  apply-timeout: 3s\n"
    process = _start(db, tmp_path, extra, {"STUCK_SOURCE": SLOW, "STUCK_SECONDS": "3.3"})
    try:
        first = _append(db, range(1, 4), SOURCES)
        began = wait_until(lambda: _started(tmp_path / "started"), timeout=30, what="the slow one")
        if not db.is_sqlite:  # other lanes go on meanwhile (SQLite: one lane per consumer)
            _others_move(db, range(4, 6))
            assert not _halted(db), "the others moved only after the halt"
        halts = wait_until(lambda: _halted(db), timeout=30, what="the halt")
        took = time.time() - began
        assert took < BOUND + 1 + SLACK, f"halted {took:.2f}s after the slow handler began"
        assert list(halts) == [partition_of(SLOW, 4)]
        halt = halts[partition_of(SLOW, 4)]
        assert halt["position"] == first[SLOW]
        assert f"apply timeout (3s) exceeded at position {first[SLOW]}" in halt["error"]
        assert SLOW not in app.applied_seqs(db)  # rolled back, not committed
        _others_move(db, range(4 if db.is_sqlite else 6, 8))
        assert len((tmp_path / "started").read_text().split()) == 1  # not applied again
    finally:
        assert stop_instance(process) == 0


def test_a_statement_that_never_ends_is_interrupted_and_parks_its_source(
    db: Database, tmp_path: Path
) -> None:
    extra = "projections:\n  on-failure: park-source\n  consumers:\n"
    extra += "    parked-seq:\n      apply-timeout: 3s\n"
    process = _start(db, tmp_path, extra, {"STUCK_SOURCE": SLOW, "STUCK_SQL": "1"})
    try:
        first = _append(db, range(1, 4), SOURCES)
        began = wait_until(lambda: _started(tmp_path / "started"), timeout=30, what="the slow one")
        found = wait_until(
            lambda: parked(db, "parked-seq")["parked"], timeout=30, what="the parked source"
        )
        took = time.time() - began
        assert took < BOUND + 1 + SLACK, f"parked {took:.2f}s after the statement began"
        assert [(p["source"], p["position"]) for p in found] == [(SLOW, first[SLOW])]
        assert f"apply timeout (3s) exceeded at position {first[SLOW]}" in found[0]["error"]
        assert not _halted(db)
        # Every other source flows, those of the slow source's partition too.
        _append(db, range(4, 6), SOURCES)
        wait_until(
            lambda: app.applied_seqs(db) == {s: [1, 2, 3, 4, 5] for s in SOURCES if s != SLOW},
            timeout=30,
            what="the other sources",
        )
        assert [p["count"] for p in parked(db, "parked-seq")["parked"]] == [5]  # all held
    finally:
        assert stop_instance(process) == 0


def _verdict(report: dict[str, Any], partition: int) -> tuple[str, str]:
    """The verdict of ``partition`` of parked-seq in a health report, and why."""
    entry = next(c for c in report["consumers"] if c["name"] == "parked-seq")
    found = next(p for p in entry["partitions"] if p["partition"] == partition)
    return str(found["verdict"]), str(found["reason"])


def test_a_hung_handler_holds_only_its_partition_and_makes_the_instance_not_live(
    db: Database, tmp_path: Path
) -> None:
    """A handler that sleeps 6 s with ``apply-timeout: 1500ms``, in a batch of every
    partition: the other partitions are applied again at once (their messages appended
    while it sleeps are applied within the timeout plus 2 s, once each), its partition
    halts at its message; ``live`` is 503 while it sleeps past the timeout by as long
    again, naming the batch of that partition alone and where its thread is (so that an
    orchestrator restarts an instance whose handler never returns), and 200 again once
    it returned; ``health`` says the halted partition's handler is stuck, where. On SQLite
    too: the handler runs without the write lock, so the instance's row says so and the
    application's appends go through meanwhile."""
    with db.transaction() as conn:
        app.metadata.create_all(conn)
    extra = "projections:\n  apply-timeout: 1500ms\n"  # above the lock-wait bound (1 s)
    config = write_config(tmp_path / "config.yaml", db, batch_size=20, extra=extra)
    port = free_port()
    started = tmp_path / "started"
    env = {"STUCK_STARTED": str(started), "STUCK_SOURCE": SLOW, "STUCK_SECONDS": "6"}
    process = start_instance(
        config, "t1", "parked_seq_app", env=env, options=("--admin-port", str(port))
    )
    slow = partition_of(SLOW, 4)
    others = [s for s in SOURCES if partition_of(s, 4) != slow]
    try:
        wait_until(lambda: probe(port, "health/live")[0] == 200, timeout=60, what="live")
        first = _append(db, range(1, 2), SOURCES)  # one batch of every partition
        began = wait_until(lambda: _started(started), timeout=30, what="the slow handler")
        appending = time.monotonic()
        _append(db, range(2, 3), others)  # appended while it sleeps: none is lost
        appended = time.monotonic() - appending  # (SQLite: the handler holds no write lock)
        assert appended < 1.0, f"the application's append waited {appended:.2f} s"
        took = app.applied_within(db, others, [1, 2], began)
        assert took < 1.5 + 2, f"the other partitions waited {took:.2f} s for the hung one"
        _, body = wait_until(
            lambda: (answer := probe(port, "health/live"))[0] == 503 and answer,
            timeout=30,
            what="not live",
        )
        [reason] = body["reasons"]
        assert f"a batch of consumer parked-seq (partitions {slow})" in reason, reason
        assert "is stuck past its apply timeout (1.5s)" in reason and "parked_seq_app.py:" in reason
        settings = load_settings(config, environ={})
        verdict, why = wait_until(
            lambda: "stuck" in (found := _verdict(health_report(db, settings), slow))[1] and found,
            timeout=30,
            what="health to see the stuck handler",
        )
        assert verdict == "halted", (verdict, why)
        assert f"halted at position {first[SLOW]}" in why and "apply timeout (1.5s)" in why
        assert "its handler is stuck past its apply timeout (1.5s)" in why
        assert "in stuck (parked_seq_app.py:" in why, why
        wait_until(lambda: probe(port, "health/live")[0] == 200, timeout=30, what="live again")
        assert list(_halted(db)) == [slow]
        assert SLOW not in app.applied_seqs(db)  # rolled back, never committed
        assert len(started.read_text().split()) == 1  # handled once: not again after it
        _append(db, range(3, 4), others)  # the instance goes on after its thread returned
        wait_until(
            lambda: all(app.applied_seqs(db).get(s) == [1, 2, 3] for s in others),
            timeout=30,
            what="the other partitions after",
        )
    finally:
        assert stop_instance(process) == 0
