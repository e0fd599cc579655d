"""Deadlines due while their owner is killed with SIGKILL are delivered exactly once:
by the owner before the kill, or by the instances that take its partitions over."""

from __future__ import annotations

import json
from pathlib import Path

import deadline_app
import pytest
from clusters import start_instance, stop_instance, wait_until, write_config
from sqlalchemy import func, select

from messaging import Database, MessageStore

pytestmark = pytest.mark.multiprocess

TIMERS = 300


def _pending(db: Database) -> int:
    d = db.schema.deadlines
    with db.read() as conn:
        return int(conn.execute(select(func.count()).where(d.c.tenant == db.tenant)).scalar_one())


def _fired(db: Database) -> list[str]:
    with db.read() as conn:
        rows = MessageStore(db).read(conn, ["test-fired"], limit=100_000)
    return [json.loads(row.payload)["timer_id"] for row in rows]


def test_deadlines_are_delivered_once_across_a_sigkill_of_their_owner(
    db: Database, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", db, batch_size=10)
    processes = {name: start_instance(config, name, "deadline_app") for name in ("t1", "t2")}
    try:
        with db.read() as conn:
            now = float(conn.execute(select(db.clock.now())).scalar_one())
        store = MessageStore(db)
        with db.transaction() as conn:
            for i in range(TIMERS):  # due over the next three seconds
                store.append(
                    conn, "timers", f"t{i}", [deadline_app.TimerSet(f"t{i}", now + 1 + i / 100)]
                )
        wait_until(lambda: 0 < len(_fired(db)) < TIMERS / 2, timeout=30, what="deliveries to start")
        processes["t1"].kill()
        processes["t1"].wait(timeout=10)
        assert _pending(db) > 0, "the kill came too late"
        wait_until(lambda: _pending(db) == 0, timeout=60, what="every deadline to be delivered")
    finally:
        for name, process in processes.items():
            if name == "t2":
                assert stop_instance(process) == 0
    fired = _fired(db)
    assert sorted(fired) == sorted(f"t{i}" for i in range(TIMERS))  # none lost, none twice
