"""Liveness signals (a file lock on SQLite, a named lock on MariaDB): a peer sees a
process that holds one as live, sees it gone soon after SIGKILL, never looks at a signal
it cannot see (another host, another server), and on MariaDB a cut connection is taken
again before any peer believes it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial

import pytest
from clusters import wait_until
from sqlalchemy import text

from messaging import Database
from messaging.store._liveness import CONFIRMATION, Signal, signal_for

CHILD = """
import sys, time
from messaging import Database
from messaging.store._liveness import signal_for
db = Database(sys.argv[1], table_prefix=sys.argv[2])
signal = signal_for(db, "child", 0.05)
signal.hold()
print(signal.describe(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def peer(db: Database) -> Iterator[Signal]:
    """This process's signal, checking peers every 50 ms."""
    signal = signal_for(db, "peer", 0.05)
    signal.hold()
    yield signal
    signal.close()


def _held_elsewhere(db: Database) -> tuple[subprocess.Popen[str], str]:
    """A child process holding the signal of instance "child"; it and its description."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, db.url, db.schema.prefix], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    return child, child.stdout.readline().strip()


def test_a_holder_is_live_until_killed_then_gone(db: Database, peer: Signal) -> None:
    child, described = _held_elsewhere(db)
    try:
        watched = time.monotonic()
        while time.monotonic() < watched + 2 * CONFIRMATION:  # past the confirmation window
            assert peer.gone({"child": described}) == []
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()
    killed = time.monotonic()
    wait_until(lambda: peer.gone({"child": described}), timeout=5, what="the child seen gone")
    assert time.monotonic() - killed < 2 * CONFIRMATION + 0.5


def test_a_signal_out_of_sight_is_not_looked_at(db: Database, peer: Signal) -> None:
    """A file on another host or at another path (another mount), a lock on another
    server: gone or not, nothing is said."""
    described = json.loads(str(peer.describe()))
    elsewhere = {**described, "host": "elsewhere", "server": "elsewhere:3306"}
    if "file" in elsewhere:
        elsewhere["file"] += ".missing"
        mounted = {**described, "file": "/mnt/elsewhere/x.lock"}
    else:
        elsewhere["lock"] = "live-nobody-holds-this"
        mounted = elsewhere
    time.sleep(2 * CONFIRMATION)
    assert peer.gone({"other": json.dumps(elsewhere), "mounted": json.dumps(mounted)}) == []


def _holder(db: Database, lock: str) -> int | None:
    """The session holding the named lock ``lock`` (None: nobody)."""
    with db.engine.connect() as conn:
        holder = conn.execute(text("SELECT IS_USED_LOCK(:l)"), {"l": lock}).scalar()
    return None if holder is None else int(holder)


def _taken_again(db: Database, lock: str, before: int | None) -> bool:
    """Whether ``lock`` is held by another session than ``before``."""
    return _holder(db, lock) not in (None, before)


@pytest.mark.mysql
@pytest.mark.parametrize("backend", ["mysql"])
def test_a_cut_lock_connection_is_taken_again_before_a_peer_believes_it(
    db: Database, peer: Signal
) -> None:
    held = signal_for(db, "held", 0.05)
    held.hold()
    described = str(held.describe())
    lock = json.loads(described)["lock"]
    try:
        time.sleep(CONFIRMATION)  # the peer's own lock counts only after its window
        for _ in range(5):
            before = _holder(db, lock)
            with db.engine.connect() as conn:
                conn.execute(text(f"KILL CONNECTION {before}"))
            wait_until(partial(_taken_again, db, lock, before), timeout=2, what="the lock again")
            cut = time.monotonic()
            while time.monotonic() < cut + 2 * CONFIRMATION:
                assert peer.gone({"held": described}) == []
                time.sleep(0.02)
    finally:
        held.close()
