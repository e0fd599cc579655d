"""Connections killed every second do not pass for crashes: while an operator (here, a
thread) ends every database session of two live instance processes once a second, their
liveness connections included, neither is declared gone nor left without its share for
longer than a rebalance round, and the read model equals the sequential replay."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from clusters import (
    lag,
    ledger_matches_replay,
    owners,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from messaging import Database
from messaging.distribution._membership import Membership
from messaging.store._liveness import GONE

pytestmark = [pytest.mark.multiprocess, pytest.mark.faults]

ROUND = 1.0
"""The instances' rebalance-interval, in seconds."""
STALE = 3.0
SETTINGS = {
    "rebalance-interval": "1s",
    "stale-instance-timeout": "3s",
    "heartbeat-interval": "300ms",
}
KILL_ROUNDS = 10


def _kill_sessions(db: Database) -> int:
    """End every session the instance rows record and every liveness lock's holder;
    return how many were ended."""
    with db.read() as conn:
        rows = Membership(db).instances(conn, STALE)
    ids = {s.id for r in rows for s in r.sessions}
    locks = [json.loads(r.liveness)["lock"] for r in rows if r.liveness and "lock" in r.liveness]
    ended = 0
    with db.engine.connect() as conn:
        for lock in locks:
            holder = conn.execute(text("SELECT IS_USED_LOCK(:l)"), {"l": lock}).scalar()
            if holder is not None:
                ids.add(int(holder))
        for session in sorted(ids):
            try:
                conn.execute(text(f"KILL CONNECTION {session}"))
            except DBAPIError:
                continue  # it had ended already
            ended += 1
    return ended


def _shares(db: Database) -> set[str]:
    """The instances that own at least one partition (OWNED)."""
    return {str(n) for n, state in owners(db, stale=STALE).values() if state == "OWNED"}


def test_sessions_killed_every_second_take_no_live_instance_over(
    db: Database, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", db, batch_size=20, consumer=SETTINGS)
    logs = [tmp_path / f"{name}.log" for name in ("a", "b")]
    instances = [start_instance(config, p.stem, log=p) for p in logs]
    wait_until(lambda: _shares(db) == {"a", "b"}, timeout=60, what="both to own a share")
    stop = threading.Event()
    killed: list[int] = []
    without: dict[str, float] = {}  # instance → since when it owns nothing
    longest = 0.0

    def kill() -> None:
        while not stop.wait(1.0):
            killed.append(_kill_sessions(db))

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    deadline = time.monotonic() + KILL_ROUNDS
    seed = 1
    try:
        while time.monotonic() < deadline:
            seed_ledger(db, 40, seed=seed)
            seed += 1
            now, shares = time.monotonic(), _shares(db)
            for name in ("a", "b"):
                since = now if name in shares else without.setdefault(name, now)
                longest = max(longest, now - since)
                if name in shares:
                    without.pop(name, None)
    finally:
        stop.set()
        killer.join()
    wait_until(lambda: lag(db) == 0, timeout=60, what="both to catch up")
    assert [stop_instance(p) for p in instances] == [0, 0]
    model, replay = ledger_matches_replay(db)
    assert model == replay
    print(f"\nsessions ended per round: {killed}; longest without a share: {longest:.2f} s")
    assert len(killed) >= KILL_ROUNDS - 1 and min(killed) >= 2  # each time, both liveness locks
    declared = sum(p.read_text(encoding="utf-8").count(GONE) for p in logs)
    assert declared == 0
    assert longest <= ROUND
