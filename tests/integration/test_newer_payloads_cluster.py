"""Payloads newer than an instance's code beyond partitioned projections, on real
``projections run`` processes: a single-owner consumer and a saga's deadlines are left
to an instance that can read them, never applied, skipped or halted at; while none is
live they wait and the reports say why; afterwards everything is applied exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import shapes_tables
from clusters import lag, owned_by, start_instance, stop_instance, wait_until, write_config
from shapes_app import write_generations
from shapes_tables import newer_sales, sales_count
from sqlalchemy import MetaData, select
from timers_shared import FIRED, TOPIC

from messaging import Database, MessageStore, NewMessage
from messaging._config import load_settings
from messaging._settings import ConsumerSettings
from messaging.distribution._ownership import Ownership
from projections._health import health_report
from projections._reports import consumers_report, format_consumers

pytestmark = pytest.mark.multiprocess

SALES = "shop-sales"
TIMERS = "test-shape-timers"
NEWER_DUE = "needs a newer declaration of type 'test-shape-timers.due' version 2"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [shapes_tables.metadata]


def test_a_single_owner_consumer_moves_whole_to_an_instance_that_reads_a_newer_payload(
    db: Database, tmp_path: Path
) -> None:
    """``shop-sales`` single-owner, held by ``old1``; ``new1`` stands by. A ``shop.sale``
    version 3 makes ``old1`` stop before it and say why; the consumer goes whole to
    ``new1``, which applies every sale once, in order, the older ones written after too."""
    write_generations(db, times=2)
    extra = "projections:\n  consumers:\n    shop-sales: {distribution: single-owner}\n"
    config = write_config(tmp_path / "config.yaml", db, extra=extra)
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "new1")}
    old = start_instance(config, "old1", "shapes_app", log=logs["old1"])
    new = None
    try:
        wait_until(lambda: owned_by(db, {"old1"}, SALES), timeout=60, what="old1 holding it")
        wait_until(lambda: sales_count(db) == 8, timeout=60, what="the old generations applied")
        new = start_instance(config, "new1", "shapes_newer_app", log=logs["new1"])
        wait_until(
            lambda: "new1" in {i["name"] for i in _live(db)}, timeout=60, what="new1 registered"
        )
        assert owned_by(db, {"old1"}, SALES)  # sticky: the holder keeps it
        with db.transaction() as conn:
            MessageStore(db).append_encoded(conn, newer_sales(8))
        write_generations(db, times=1, first=2)  # an older producer still writes too
        wait_until(lambda: owned_by(db, {"new1"}, SALES), timeout=60, what="new1 holding it")
        wait_until(lambda: sales_count(db) == 8 + 8 + 4, timeout=60, what="every sale applied")
        wait_until(lambda: lag(db, SALES) == 0, timeout=60, what="no lag")
        with db.read() as conn:
            parts = Ownership(db).partitions(conn, [SALES])
        assert {p.status for p in parts} == {"running"}
        assert stop_instance(old) == 0
        assert owned_by(db, {"new1"}, SALES) and lag(db, SALES) == 0
    finally:
        for process in [old, *([new] if new else [])]:
            if process.poll() is None:
                stop_instance(process)
    with db.read() as conn:
        rows = conn.execute(select(shapes_tables.sales)).mappings().all()
    assert sorted(r["amount"] for r in rows if r["order_id"].startswith("n")) == list(
        range(100, 108)
    )
    said = logs["old1"].read_text()
    stops = [line for line in said.splitlines() if "is left to another instance" in line]
    assert len([line for line in stops if f"consumer {SALES} " in line]) == 1, said
    assert len(stops) == len(set(line.split(": ", 1)[1] for line in stops)), said  # once each
    assert "halt" not in said.lower()
    assert "needs a newer" not in logs["new1"].read_text()


def _live(db: Database) -> list[dict[str, object]]:
    from projections._reports import instances_report

    return [i for i in instances_report(db, ConsumerSettings())["instances"] if i["live"]]


def _fired(db: Database) -> list[tuple[str, str]]:
    """The ``Fired`` commands the deliveries sent: (timer id, the reason its deadline said)."""
    m = db.schema.messages
    with db.read() as conn:
        payloads = conn.execute(select(m.c.payload).where(m.c.topic == FIRED)).scalars().all()
    return sorted((p["timer_id"], p["reason"]) for p in map(json.loads, payloads))


def _deadlines(db: Database) -> int:
    with db.read() as conn:
        name = f"{db.schema.prefix}deadlines"
        return int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {name}").scalar_one())


def test_a_saga_deadline_newer_than_the_code_waits_for_an_instance_that_reads_it(
    db: Database, tmp_path: Path
) -> None:
    """``new1`` schedules eight deadlines at version 2 and stops before they fall due;
    ``old1`` (version 1) meets them, delivers none, halts nothing, and leaves their
    partitions, which wait (status and health say why) until ``new1`` is back: then each
    is delivered exactly once."""
    config = write_config(tmp_path / "config.yaml", db)
    settings = load_settings(config, environ={})
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "new1", "new1-again")}
    timers = [f"t{i}" for i in range(8)]
    processes = [start_instance(config, "new1", "timers_newer_app", log=logs["new1"])]
    try:
        wait_until(lambda: owned_by(db, {"new1"}, TIMERS), timeout=60, what="new1 holding it")
        due_at = time.time() + 6  # after new1 stopped (whatever the load)
        with db.transaction() as conn:
            for timer in timers:
                body = json.dumps({"timer_id": timer, "due_at": due_at})
                MessageStore(db).append_encoded(
                    conn,
                    [
                        NewMessage(
                            topic=TOPIC, source=timer, type="test-shape-timers.set", payload=body
                        )
                    ],
                )
        wait_until(lambda: _deadlines(db) == 8, timeout=60, what="eight deadlines scheduled")
        assert stop_instance(processes[0]) == 0
        processes.append(start_instance(config, "old1", "timers_app", log=logs["old1"]))
        wait_until(
            lambda: NEWER_DUE in logs["old1"].read_text(), timeout=60, what="old1 to meet one"
        )

        def waiting() -> list[dict[str, object]]:
            report = consumers_report(db, ConsumerSettings())
            [timers_entry] = [c for c in report["consumers"] if c["name"] == TIMERS]
            return [p for p in timers_entry["partitions"] if "waiting" in p]

        held = wait_until(lambda: len(waiting()) == 4 and waiting(), timeout=60, what="all wait")
        assert all(p["state"] == "UNCLAIMED" and p["status"] == "running" for p in held)
        assert f"waiting: it {NEWER_DUE}" in format_consumers(
            consumers_report(db, ConsumerSettings())
        )

        def unowned() -> list[dict[str, object]]:
            [entry] = [c for c in health_report(db, settings)["consumers"] if c["name"] == TIMERS]
            return [p for p in entry["partitions"] if p["verdict"] == "unowned"]

        verdicts = wait_until(lambda: len(unowned()) == 4 and unowned(), timeout=60, what="health")
        assert all(NEWER_DUE in str(p["reason"]) for p in verdicts), verdicts
        assert _fired(db) == [] and _deadlines(db) == 8
        processes.append(start_instance(config, "new1", "timers_newer_app", log=logs["new1-again"]))
        wait_until(lambda: len(_fired(db)) == 8, timeout=60, what="every deadline delivered")
        wait_until(lambda: not waiting(), timeout=60, what="nothing left waiting")
        for process in processes[1:]:
            assert stop_instance(process) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                stop_instance(process)
    assert _fired(db) == [(t, "version 2") for t in timers]
    assert _deadlines(db) == 0
    said = logs["old1"].read_text()
    assert "halt" not in said.lower(), said
    stops = [line for line in said.splitlines() if "is left to another instance" in line]
    assert len(stops) == 1, said  # one line per cause a minute (four partitions left for it)
    assert "needs a newer" not in logs["new1-again"].read_text()
