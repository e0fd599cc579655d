"""Declaration changes: a new declaration builds a version beside the live one, the
declaration one back applies nothing once the new one is live, and a rebuild left in
place by an older release is taken as a request."""

from __future__ import annotations

import json
import logging

import attrs
import pytest
from clusters import wait_until
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, inspect, select, update

from messaging import Database, HandlerContext, handler, message
from messaging._consumers import consumer_spec
from messaging._settings import ConsumerSettings, Distribution
from messaging._states import DeclarationOutcome
from messaging.distribution._claimable import SWAPPING
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.store._ddl import drop_tables_if_exist
from messaging.versions._cutover import step
from messaging.versions._declarations import declare, start_requested_rebuild
from messaging.versions._versions import create_version_tables, split_unit, unit_rows
from projections import _operations as operations
from projections import projection
from projections._version_commands import versions_report

P = Distribution.PARTITIONED


@message("test.decl.noted")
@attrs.define(frozen=True)
class Noted:
    text: str


def _spec(db: Database, version: int, table_name: str = "decl_notes"):  # type: ignore[no-untyped-def]
    table = Table(
        f"{db.schema.prefix}{table_name}",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("text", String(50)),
    )

    @projection("decl-notes", topics="notes", partitions=4, tables=[table], version=version)
    class Notes:
        @handler
        def noted(self, event: Noted, ctx: HandlerContext) -> None:
            ctx.execute(insert(table), {"text": event.text})

    return consumer_spec(Notes), table


def _register(db: Database, instance_id: str) -> None:
    with db.transaction() as conn:
        Membership(db).register(
            conn,
            InstanceInfo(
                id=instance_id, name=instance_id, host="h", pid=1, runs={"decl-notes": {}}
            ),
        )


def _cut_over(db: Database, spec, unit: str) -> None:  # type: ignore[no-untyped-def]
    """Take the cutover steps of version ``unit`` of ``spec`` (an empty stream: each at once),
    as an instance building it would (its tables made first)."""
    assert create_version_tables(db, spec, unit, split_unit(unit)[1] or 0)
    step(db, spec, unit, batch_size=100, keep=1)  # the live version stops
    step(db, spec, unit, batch_size=100, keep=1)  # the versions change places
    with db.read() as conn:
        assert [u.version for u in unit_rows(db, conn, [spec.name]) if u.live] == [
            split_unit(unit)[1]
        ]


def _count(db: Database, name: str) -> int:
    with db.read() as conn:
        return int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {_quoted(db, name)}").scalar_one())


def _quoted(db: Database, name: str) -> str:
    return f"`{name}`" if not db.is_sqlite else f'"{name}"'


def test_a_new_declaration_builds_a_version_beside_the_live_one(db: Database) -> None:
    """The live owner keeps its claims and rows; the new version has partitions of its
    own from checkpoint 0 and empty tables of its own, ``_v2__<table>``."""
    v1, table = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "old")
    _register(db, "new")
    ownership = Ownership(db)
    assert declare(db, v1, P, "old", instance_name="old").outcome == DeclarationOutcome.CREATED
    with db.transaction() as conn:
        claims = ownership.claim(conn, "decl-notes", range(4), "old", Membership(db).live_ids(30))
        conn.execute(insert(table), {"text": "written under v1"})
    held = {c.partition: c for c in claims}

    declared = declare(db, v2, P, "new", instance_name="new")
    assert (declared.outcome, declared.unit) == (DeclarationOutcome.BUILDING, "decl-notes@2")

    with db.transaction() as conn:
        ownership.commit_checkpoint(conn, "decl-notes", "old", held, 99)
    with db.read() as conn:
        assert len(conn.execute(select(table)).all()) == 1
        built = ownership.partitions(conn, ["decl-notes@2"])
    assert [(r.owner, r.checkpoint) for r in built] == [(None, 0)] * 4
    assert create_version_tables(db, v2, "decl-notes@2", 2)  # as an instance building it does
    assert _count(db, f"_v2__{table.name}") == 0


def test_instances_join_the_build_and_a_newer_declaration_replaces_it(db: Database) -> None:
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    v3, _ = _spec(db, 3)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    assert declare(db, v2, P, "a", instance_name="a").unit == "decl-notes@2"
    assert declare(db, v2, P, "b", instance_name="b").unit == "decl-notes@2"
    assert declare(db, v3, P, "a", instance_name="a").unit == "decl-notes@3"
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED
    with db.read() as conn:
        states = {u.unit: u.state for u in unit_rows(db, conn, ["decl-notes"])}
    assert states == {"decl-notes": "running", "decl-notes@2": "retired", "decl-notes@3": "running"}


def test_the_declaration_one_back_is_stale_once_the_new_one_is_live(db: Database) -> None:
    """An instance still on the previous declaration is told to apply nothing."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    _cut_over(db, v2, declare(db, v2, P, "a", instance_name="a").unit)
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED


def test_a_rebuild_left_in_place_by_an_older_release_is_taken_as_a_request(db: Database) -> None:
    """A consumer left REBUILDING (by a release that rebuilt in place) builds a version."""
    v1, table = _spec(db, 1)
    _register(db, "a")
    fingerprint = declare(db, v1, P, "a", instance_name="a").fingerprint
    consumers = db.schema.consumers
    with db.transaction() as conn:
        conn.execute(insert(table), {"text": "half-rebuilt"})
        conn.execute(update(consumers).values(state="rebuilding"))
    assert start_requested_rebuild(db, v1, fingerprint, P)
    assert not start_requested_rebuild(db, v1, fingerprint, P)
    with db.read() as conn:
        assert len(conn.execute(select(table)).all()) == 1  # read until the cutover
        states = {u.unit: u.state for u in unit_rows(db, conn, ["decl-notes"])}
    assert states == {"decl-notes": "running", "decl-notes@2": "running"}


def test_an_even_older_declaration_applies_nothing_and_does_not_rebuild_back(
    db: Database,
) -> None:
    """v1 → v2 → v3: an instance still on v1 is stale too, and the read model stays v3's."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    v3, _ = _spec(db, 3)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    _cut_over(db, v2, declare(db, v2, P, "a", instance_name="a").unit)
    _cut_over(db, v3, declare(db, v3, P, "a", instance_name="a").unit)
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
    assert declare(db, v3, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED


def test_a_requested_rebuild_rolls_back_to_a_left_behind_declaration(db: Database) -> None:
    """v1 → v2, then an operator asks for a rebuild: an instance starting on v1 builds a
    version under v1, which is live again after its cutover, and v2 is left behind."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    _cut_over(db, v2, declare(db, v2, P, "a", instance_name="a").unit)
    operations.rebuild(db, "decl-notes", who="test", reason="roll back")
    declared = declare(db, v1, P, "a", instance_name="a")
    assert (declared.outcome, declared.unit) == (DeclarationOutcome.BUILDING, "decl-notes@3")
    _cut_over(db, v1, declared.unit)
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE


def test_a_version_whose_swap_began_cannot_be_claimed_again(db: Database) -> None:
    """On MySQL the swap marks the live row, fences the new version, then renames the
    tables: a round between the two must not claim the new version's partitions (a batch
    after the rename would find its tables gone and halt the partition, which then
    becomes live)."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    unit = declare(db, v2, P, "a", instance_name="a").unit
    ownership, live_ids = Ownership(db), Membership(db).live_ids(30)
    c = db.schema.consumers
    with db.transaction() as conn:
        conn.execute(
            update(c)
            .where(c.c.name == "decl-notes")
            .values(state="cutting-over", cutover=json.dumps({"version": 2, "swapping": True}))
        )
        assert SWAPPING in json.dumps({"version": 2, "swapping": True})
        assert ownership.claim(conn, unit, range(4), "a", live_ids) == []
        conn.execute(update(c).where(c.c.name == "decl-notes").values(cutover=None))
        assert len(ownership.claim(conn, unit, range(4), "a", live_ids)) == 4


def test_a_version_that_took_over_or_was_replaced_gets_no_tables_again(db: Database) -> None:
    """An instance whose round read a version as building after another instance's swap
    renamed its tables (or a newer declaration replaced it) makes no empty tables under
    the names a later swap renames the live ones to."""
    v1, table = _spec(db, 1)
    v2, _ = _spec(db, 2)
    v3, _ = _spec(db, 3)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    _cut_over(db, v2, declare(db, v2, P, "a", instance_name="a").unit)
    assert not create_version_tables(db, v2, "decl-notes@2", 2)  # a stale round's start
    replaced = declare(db, v3, P, "a", instance_name="a").unit
    assert declare(db, _spec(db, 4)[0], P, "a", instance_name="a").unit == "decl-notes@4"
    assert not create_version_tables(db, v3, replaced, 3)
    with db.read() as conn:
        present = set(inspect(conn).get_table_names())
    assert {f"_v2__{table.name}", f"_v3__{table.name}"}.isdisjoint(present)


def test_a_table_in_the_way_of_the_swap_holds_it_until_moved(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A table holding the name the live tables are renamed to: the swap waits (the live
    version stays whole, one warning naming the table per attempt), and takes place once
    the table is gone."""
    v1, table = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    unit = declare(db, v2, P, "a", instance_name="a").unit
    in_way = Table(f"_v1__{table.name}", MetaData(), Column("id", Integer, primary_key=True))
    with db.transaction() as conn:
        in_way.create(conn)
    assert create_version_tables(db, v2, unit, 2)
    step(db, v2, unit, batch_size=100, keep=1)  # the live version stops
    with caplog.at_level(logging.WARNING, logger="messaging.runtime.cutover"):
        step(db, v2, unit, batch_size=100, keep=1)
        step(db, v2, unit, batch_size=100, keep=1)  # within the backoff: not tried again
    assert [r.getMessage() for r in caplog.records if r.name.endswith(".cutover")] == [
        f"decl-notes: the swap to version 2 cannot rename tables to _v1__{table.name}: "
        "tables by those names exist; trying again in 2 s"
    ]
    with db.read() as conn:
        assert [u.version for u in unit_rows(db, conn, ["decl-notes"]) if u.live] == [1]
    drop_tables_if_exist(db, [in_way.name])

    def swapped() -> bool:
        step(db, v2, unit, batch_size=100, keep=1)
        return _live(db) == 2

    wait_until(swapped, timeout=10, what="the swap after the table was moved")


def _live(db: Database) -> int:
    with db.read() as conn:
        return next(u.version for u in unit_rows(db, conn, ["decl-notes"]) if u.live)


def test_versions_lists_only_tables_that_exist_after_a_version_renamed_one(db: Database) -> None:
    """Version 2 names its table anew: once it is live, ``versions`` lists the new name for
    the live version (the old name is gone: it was renamed for the retired version), and
    every table it lists exists."""
    v1, old = _spec(db, 1)
    v2, new = _spec(db, 2, "decl_notes_renamed")
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    _cut_over(db, v2, declare(db, v2, P, "a", instance_name="a").unit)
    report = versions_report(db, ConsumerSettings(), "decl-notes")
    with db.read() as conn:
        present = set(inspect(conn).get_table_names())
    listed = {v["role"]: v["tables"] for v in report["versions"]}
    try:
        assert listed["live"] == [new.name]
        assert old.name not in present
        assert all(t in present for tables in listed.values() for t in tables), listed
    finally:
        drop_tables_if_exist(db, [t for tables in listed.values() for t in tables])
