"""Instance rows: old stale rows are removed, judged by the database clock; nothing breaks;
one reader sees every change between its reads."""

from __future__ import annotations

import types
import uuid

import pytest
from sqlalchemy import select

from messaging import Database, Instance, Settings, collect_consumers, create_plugin_manager
from messaging.distribution._membership import (
    MIN_STALE_ROW_RETENTION,
    STALE_ROW_PURGE_INTERVAL,
    STALE_ROW_RETENTION_FACTOR,
    InstanceInfo,
    Membership,
    stale_row_retention,
)
from messaging.distribution._ownership import Ownership
from messaging.store._clock import ManualClock

STALE_TIMEOUT = 30.0  # the default: rows go after 10 x 30 s = 300 s
CONSUMER = "ledger-balances"


def _db_now(db: Database) -> float:
    with db.read() as conn:
        return float(conn.execute(select(db.clock.now())).scalar_one())


def _backdated(db: Database, seconds_ago: float, tenant: str | None = None) -> Database:
    """The same database, with a clock ``seconds_ago`` behind the database's clock."""
    return Database(
        db.url,
        tenant=tenant or db.tenant,
        table_prefix=db.schema.prefix,
        clock=ManualClock(_db_now(db) - seconds_ago),
    )


def _register(db: Database, name: str) -> str:
    instance_id = uuid.uuid4().hex
    with db.transaction() as conn:
        Membership(db).register(
            conn, InstanceInfo(id=instance_id, name=name, host="test-host", pid=1)
        )
    return instance_id


def _names(db: Database) -> dict[str, bool]:
    with db.read() as conn:
        return {r.name: r.live for r in Membership(db).instances(conn, STALE_TIMEOUT)}


def _all_rows(db: Database) -> set[tuple[str, str]]:
    t = db.schema.instances
    with db.read() as conn:
        return {(r.tenant, r.name) for r in conn.execute(select(t.c.tenant, t.c.name))}


def _instance(db: Database, name: str) -> Instance:
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    return Instance(db, collect_consumers(manager), Settings(), manager.hook, name=name)


def test_retention_is_a_generous_multiple_of_the_stale_timeout() -> None:
    assert STALE_ROW_RETENTION_FACTOR >= 10
    assert stale_row_retention(30.0) == 300.0
    assert stale_row_retention(1.0) == MIN_STALE_ROW_RETENTION == 60.0


def test_old_rows_go_live_and_recently_stale_rows_stay(db: Database) -> None:
    """Only rows whose heartbeat is older than the retention go, and only of this tenant."""
    old = _backdated(db, 400.0)
    older = _backdated(db, 10_000.0)
    recent = _backdated(db, 40.0)  # stale (> 30 s) but within the retention (300 s, or 60 s)
    borderline = _backdated(db, 290.0)
    other_tenant = _backdated(db, 10_000.0, tenant="someone-else")
    try:
        _register(old, "old")
        _register(older, "older")
        _register(recent, "recent")
        _register(borderline, "borderline")
        _register(other_tenant, "other-tenant")
        _register(db, "live")
        assert _names(db) == {
            "old": False,
            "older": False,
            "recent": False,
            "borderline": False,
            "live": True,
        }
        with db.transaction() as conn:
            removed = Membership(db).remove_stale(conn, STALE_TIMEOUT)
        assert removed == 2
        assert _names(db) == {"recent": False, "borderline": False, "live": True}
        assert ("someone-else", "other-tenant") in _all_rows(db)
        # A short stale timeout still keeps rows for at least a minute.
        with db.transaction() as conn:
            assert Membership(db).remove_stale(conn, 1.0) == 1  # "borderline": 290 s > 60 s
        assert _names(db) == {"recent": False, "live": True}
    finally:
        for database in (old, older, recent, borderline, other_tenant):
            database.dispose()


def test_partitions_of_a_removed_instance_are_claimable(db: Database) -> None:
    """A removed owner is not live: its partitions are claimed under a new epoch."""
    dead_db = _backdated(db, 1_000.0)
    try:
        dead = _register(dead_db, "dead")
        ownership = Ownership(db)
        with db.transaction() as conn:
            ownership.ensure_partitions(conn, "c", 4)
            claims = Ownership(dead_db).claim(
                conn, "c", range(4), dead, Membership(dead_db).live_ids(STALE_TIMEOUT)
            )
        assert [c.epoch for c in claims] == [1, 1, 1, 1]
        with db.transaction() as conn:
            assert Membership(db).remove_stale(conn, STALE_TIMEOUT) == 1
        alive = _register(db, "alive")
        with db.transaction() as conn:
            claims = ownership.claim(
                conn, "c", range(4), alive, Membership(db).live_ids(STALE_TIMEOUT)
            )
        assert {(c.partition, c.epoch) for c in claims} == {(p, 2) for p in range(4)}
        with db.read() as conn:
            assert {row.owner for row in ownership.partitions(conn, ["c"])} == {alive}
    finally:
        dead_db.dispose()


def test_the_heartbeat_removes_old_rows_about_once_a_minute(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instance.heartbeat() purges at once, then not again before the purge interval."""
    monotonic = [1_000.0]
    import messaging.distribution._membership as membership_module

    monkeypatch.setattr(
        membership_module, "time", types.SimpleNamespace(monotonic=lambda: monotonic[0])
    )
    backdated = _backdated(db, 1_000.0)
    instance = _instance(db, "beating")
    instance.start(loops=False)
    try:
        _register(backdated, "crashed-1")
        instance.heartbeat()
        assert _names(db) == {"beating": True}
        _register(backdated, "crashed-2")
        monotonic[0] += STALE_ROW_PURGE_INTERVAL / 2
        instance.heartbeat()
        assert _names(db) == {"beating": True, "crashed-2": False}
        monotonic[0] += STALE_ROW_PURGE_INTERVAL / 2
        instance.heartbeat()
        assert _names(db) == {"beating": True}
    finally:
        instance.stop()
        backdated.dispose()
    assert _names(db) == {}


def test_an_instance_whose_row_was_removed_registers_again_and_loses_to_the_new_owner(
    db: Database,
) -> None:
    """A paused instance's row can be purged: on waking it registers again, and another
    instance that claimed its partitions meanwhile keeps them (the old fence fails)."""
    sleeper = _instance(db, "sleeper")
    sleeper.start(loops=False)
    backdated = _backdated(db, 1_000.0)
    newcomer = _instance(db, "newcomer")
    try:
        assert len(sleeper.workers[CONSUMER].claims()) == 8
        # The sleeper "pauses" for 1000 s: its last heartbeat is that old, then it is purged.
        with backdated.transaction() as conn:
            assert Membership(backdated).heartbeat(conn, sleeper.id, 30.0) != "removed"
        with db.transaction() as conn:
            assert Membership(db).remove_stale(conn, STALE_TIMEOUT) == 1
        newcomer.start(loops=False)  # sole live instance: claims all 8 partitions
        assert len(newcomer.workers[CONSUMER].claims()) == 8
        with db.read() as conn:
            owners = {r.owner for r in Ownership(db).partitions(conn, [CONSUMER])}
        assert owners == {newcomer.id}
        # The sleeper wakes: its heartbeat registers it again; its rebalance sees it lost
        # everything; the two share the partitions from then on.
        sleeper.heartbeat()
        assert _names(db) == {"newcomer": True, "sleeper": True}
        sleeper.rebalance()
        newcomer.rebalance()
        sleeper.rebalance()
        mine = set(sleeper.workers[CONSUMER].claims())
        theirs = set(newcomer.workers[CONSUMER].claims())
        assert not mine & theirs
        assert len(mine) == len(theirs) == 4
    finally:
        newcomer.stop()
        sleeper.stop()
        backdated.dispose()


def test_one_membership_reads_what_changed_since_its_last_read(db: Database) -> None:
    """Its statement is built once and its rows' JSON parsed once per text: a member's
    runs and sessions changed between two reads, and a manual clock moved, are seen."""
    clocked = _backdated(db, 0.0)
    membership = Membership(clocked)
    try:
        member = _register(clocked, "member")
        with clocked.read() as conn:
            (before,) = membership.instances(conn, STALE_TIMEOUT)
        assert before.runs == {} and before.live
        runs = {CONSUMER: {"distribution": "partitioned", "fingerprint": "f"}}
        t = clocked.schema.instances
        with clocked.transaction() as conn:
            membership.update_runs(conn, member, runs)
            sessions = '[["db:3306", 1700000000, 7]]'
            conn.execute(t.update().where(t.c.id == member).values(sessions=sessions))
        assert isinstance(clocked.clock, ManualClock)
        clocked.clock.advance(STALE_TIMEOUT - 1.0)
        with clocked.read() as conn:
            (after,) = membership.instances(conn, STALE_TIMEOUT)
        assert after.runs == runs
        assert [(s.server, s.boot, s.id) for s in after.sessions] == [("db:3306", 1700000000, 7)]
        assert after.live and after.expires_in == pytest.approx(before.expires_in - 29.0, abs=1e-3)
        clocked.clock.advance(2.0)
        with clocked.read() as conn:
            (stale,) = membership.instances(conn, STALE_TIMEOUT)
        assert not stale.live and stale.runs == runs and stale.sessions == after.sessions
        with clocked.transaction() as conn:
            membership.update_runs(conn, member, {})
        with clocked.read() as conn:
            assert [r.runs for r in membership.instances(conn, STALE_TIMEOUT)] == [{}]
    finally:
        clocked.dispose()
