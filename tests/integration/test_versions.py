"""Rebuilds without downtime, on real ``projections run`` processes: while a new version
is built beside the live one and takes over, a reader querying the declared table every
few milliseconds never sees it empty, partly built or going back; an instance killed
while building its share leaves the version to the others, which still completes equal
to a sequential replay; a projection that sends sends nothing twice across a rebuild."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import sending_app
from clusters import (
    cli,
    lag,
    ledger_matches_replay,
    live_version,
    owned_by,
    owners,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)
from readers import Reader, Traffic
from sqlalchemy import MetaData, func, select

from messaging import Database, MessageStore
from messaging.store._ddl import DDL_LOCK_WAIT
from projections.examples import ledger

pytestmark = pytest.mark.multiprocess

BUILDING = "ledger-balances@2"


def test_readers_see_the_live_version_whole_until_the_new_one_takes_over(
    db: Database, tmp_path: Path
) -> None:
    seed_ledger(db, 3000, seed=41)
    config = write_config(tmp_path / "config.yaml", db, batch_size=50)
    processes = [start_instance(config, name) for name in ("v1", "v2")]
    reader, traffic = Reader(db), Traffic(db)
    try:
        wait_until(lambda: owned_by(db, {"v1", "v2"}), timeout=60, what="v1 and v2 to share")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the first pass")
        reader.start()
        traffic.start()
        cli(config, "rebuild", "ledger-balances", "--reason", "new version")
        wait_until(lambda: live_version(db) == 2, timeout=60, what="version 2 to take over")
        traffic.stop()
        wait_until(lambda: lag(db) == 0, timeout=60, what="the new version to catch up")
        reader.stop()
    finally:
        traffic.stop()
        reader.stop()
        for process in processes:
            assert stop_instance(process) == 0
    actual, expected = ledger_matches_replay(db)
    print(
        f"\nreads {reader.reads}, went back {reader.went_back}, errors {len(reader.errors)}, "
        f"traffic rounds {traffic.rounds}"
    )
    assert reader.reads > 50 and traffic.rounds > 0
    assert reader.errors == []
    assert reader.went_back == 0
    assert actual == expected


def _state(db: Database, consumer: str = "ledger-balances") -> str | None:
    c = db.schema.consumers
    with db.read() as conn:
        return conn.execute(
            select(c.c.state).where(c.c.tenant == db.tenant, c.c.name == consumer)
        ).scalar_one_or_none()


def test_a_reader_holding_a_transaction_delays_the_swap_without_stalling_the_others(
    db: Database, tmp_path: Path
) -> None:
    """An application transaction left open on the live table holds the swap back (on
    MySQL its metadata lock holds the rename) for as long as it stays open; meanwhile the
    other readers' queries wait at most the rename's lock wait, and the swap follows as
    soon as the transaction ends."""
    seed_ledger(db, 1000, seed=47)
    config = write_config(tmp_path / "config.yaml", db, batch_size=50)
    process = start_instance(config, "h1")
    reader = Reader(db, every=0.005)
    holder = Database(db.url, table_prefix=db.schema.prefix)
    try:
        wait_until(lambda: lag(db) == 0, timeout=60, what="the first pass")
        reader.start()
        with holder.read() as long:  # BEGIN; SELECT ... and nothing more, for a while
            long.execute(select(func.count()).select_from(ledger.balances)).one()
            cli(config, "rebuild", "ledger-balances", "--reason", "held")
            wait_until(  # (on SQLite the swap may follow the stop within a poll)
                lambda: _state(db) == "cutting-over" or live_version(db) == 2,
                timeout=60,
                what="the live version to stop",
            )
            held_until = time.monotonic() + 4 * DDL_LOCK_WAIT  # several rename attempts
            while time.monotonic() < held_until:
                if db.is_sqlite:
                    break  # SQLite renames beside open readers: nothing to hold back
                assert live_version(db) == 1, "swapped while a reader held the live table"
                time.sleep(0.05)
        wait_until(lambda: live_version(db) == 2, timeout=30, what="version 2 to take over")
        reader.stop()
    finally:
        reader.stop()
        holder.dispose()
        assert stop_instance(process) == 0
    print(f"\nslowest read {reader.slowest:.2f} s of {reader.reads}")
    assert reader.errors == [] and reader.went_back == 0
    assert reader.slowest < DDL_LOCK_WAIT + 0.75
    actual, expected = ledger_matches_replay(db)
    assert actual == expected


def test_an_instance_killed_while_building_leaves_its_share_to_the_others(
    db: Database, tmp_path: Path
) -> None:
    seed_ledger(db, 12000, seed=43)
    config = write_config(tmp_path / "config.yaml", db, batch_size=20)
    processes = {name: start_instance(config, name) for name in ("k1", "k2")}
    builder: str | None = None
    try:
        wait_until(lambda: owned_by(db, {"k1", "k2"}), timeout=60, what="k1 and k2 to share")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the first pass")
        cli(config, "rebuild", "ledger-balances", "--reason", "kill test")
        # Whichever instance is seen building first is killed (the build of 12,000
        # messages may take a second: waiting for one of them could miss it).
        builder = wait_until(
            lambda: next(
                (n for n, state in owners(db, BUILDING).values() if state == "OWNED"), None
            ),
            timeout=30,
            what="an instance to build its share",
        )
        processes[builder].kill()
        processes[builder].wait(timeout=10)
        killed_at = time.monotonic()
        wait_until(lambda: live_version(db) == 2, timeout=60, what="version 2 to take over")
        print(f"\n{builder} killed; version 2 live {time.monotonic() - killed_at:.1f} s after")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the new version to catch up")
    finally:
        for name, process in processes.items():
            if name != builder:
                assert stop_instance(process) == 0
            elif process.poll() is None:
                process.kill()
    actual, expected = ledger_matches_replay(db)
    assert actual == expected


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [ledger.metadata, sending_app.metadata]


def _append_numbered(db: Database, start: int, count: int) -> None:
    store = MessageStore(db)
    with db.transaction() as conn:
        for seq in range(start, start + count):
            for source in ("a", "b", "c"):
                store.append(conn, sending_app.TOPIC, source, [sending_app.Numbered(source, seq)])


def _jobs(db: Database) -> Counter[str]:
    with db.read() as conn:
        return Counter(conn.execute(select(sending_app.done.c.job_id)).scalars())


def test_a_sending_projection_sends_nothing_twice_across_a_rebuild(
    db: Database, tmp_path: Path
) -> None:
    """Its new version replays every message without sending again what the live version
    sent; messages appended during the build and after the cutover are sent once."""
    config = write_config(tmp_path / "config.yaml", db, batch_size=10)
    processes = [start_instance(config, name, "sending_app") for name in ("s1", "s2")]
    try:
        wait_until(
            lambda: owned_by(db, {"s1", "s2"}, sending_app.CONSUMER),
            timeout=60,
            what="s1 and s2 to share",
        )
        _append_numbered(db, 1, 100)
        wait_until(lambda: sum(_jobs(db).values()) == 300, timeout=60, what="300 jobs run")
        cli(config, "rebuild", sending_app.CONSUMER, "--reason", "gate")
        for start in range(101, 161, 10):  # during the build and the cutover
            _append_numbered(db, start, 10)
        wait_until(
            lambda: live_version(db, sending_app.CONSUMER) == 2,
            timeout=60,
            what="version 2 to take over",
        )
        _append_numbered(db, 161, 10)
        wait_until(lambda: sum(_jobs(db).values()) >= 510, timeout=60, what="510 jobs run")
        wait_until(
            lambda: lag(db, sending_app.CONSUMER) == 0 and lag(db, sending_app.JOBS) == 0,
            timeout=60,
            what="everything applied",
        )
    finally:
        for process in processes:
            assert stop_instance(process) == 0
    jobs = _jobs(db)
    assert len(jobs) == 510 and set(jobs.values()) == {1}, jobs.most_common(3)
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(sending_app.seen)).scalar() == 510
