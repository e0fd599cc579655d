"""A start that meets lock waits retries until it gets through, rather than exiting: 64
instances started at once made some exit when the tenant's generation row (which every
join updates) was held past their lock-wait bound more times than ``conflict-retry``
allows. Here another connection holds that row (on SQLite, the write lock) for several
lock-wait bounds while a real instance process starts with one retry allowed; the
instance must register once it is released, and run. A stop asked for while it waits
ends the start at once, cleanly."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from clusters import (
    lag,
    registered,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)
from sqlalchemy import make_url, update

from messaging import Database
from messaging.distribution._pulse import bump_generation

pytestmark = pytest.mark.multiprocess

STALE = 4.0
"""The instance's stale-instance-timeout: a lock-wait bound of 1 s (its least)."""
HELD = 4.0
"""Seconds the row stays locked: four lock waits, more than the one retry allowed."""


@contextmanager
def generation_held(db: Database) -> Iterator[None]:
    """The tenant's generation row locked by another transaction (the whole write lock on
    SQLite) until the block ends."""
    if db.is_sqlite:
        holder = sqlite3.connect(str(make_url(db.url).database), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.rollback()
            holder.close()
        return
    g = db.schema.generations
    with db.engine.connect() as conn, conn.begin() as transaction:
        conn.execute(update(g).where(g.c.tenant == db.tenant).values(generation=g.c.generation))
        try:
            yield
        finally:
            transaction.rollback()


def _config(db: Database, tmp_path: Path) -> Path:
    with db.transaction() as conn:
        bump_generation(db, conn)  # the row exists before it is held
    consumer = {"stale-instance-timeout": f"{STALE}s", "conflict-retry": {"max-retries": 1}}
    return write_config(tmp_path / "config.yaml", db, consumer=consumer)


def _waits(log: Path) -> list[str]:
    """The lines of ``log`` that say the start waits for a lock."""
    return [line for line in log.read_text().splitlines() if "waits for a lock" in line]


def test_a_start_that_meets_a_held_generation_row_waits_and_runs(
    db: Database, tmp_path: Path
) -> None:
    seed_ledger(db, 100, seed=5)
    config = _config(db, tmp_path)
    log = tmp_path / "a.log"
    with generation_held(db):
        process = start_instance(config, "a", log=log)
        # (a loaded machine may take seconds to start it: the hold counts from its wait)
        wait_until(lambda: _waits(log), timeout=60, what="the start to meet the held row")
        time.sleep(HELD)  # the row held as long as a slow peer's join would
        assert process.poll() is None, f"the start gave up:\n{log.read_text()}"
        assert not registered(db, "a")
    wait_until(partial(registered, db, "a"), timeout=30, what="a to register")
    wait_until(lambda: lag(db) == 0, timeout=30, what="a to apply the ledger")
    assert stop_instance(process) == 0
    assert len(_waits(log)) == 1, log.read_text()  # said once, however many retries


def test_a_stop_asked_for_while_the_start_waits_ends_it_cleanly(
    db: Database, tmp_path: Path
) -> None:
    config, log = _config(db, tmp_path), tmp_path / "a.log"
    with generation_held(db):
        process = start_instance(config, "a", log=log)
        wait_until(partial(_waits, log), timeout=60, what="a to wait for the lock")
        process.send_signal(signal.SIGTERM)
        asked = time.monotonic()
        code = process.wait(timeout=30)
        took = time.monotonic() - asked
    assert code == 0, log.read_text()
    assert took < STALE, took  # one lock wait (1 s) at most, not the start's patience
    assert not registered(db, "a")
