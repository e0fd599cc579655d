"""Declaration changes: a rebuild fences every old owner, the declaration one back applies
nothing, and an interrupted rebuild is redone."""

from __future__ import annotations

import attrs
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, update

from messaging import Database, HandlerContext, OwnershipLost, handler, message
from messaging._consumers import consumer_spec
from messaging._settings import Distribution
from messaging._states import DeclarationOutcome
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.runtime._declarations import declare
from projections import _operations as operations
from projections import projection

P = Distribution.PARTITIONED


@message("test.decl.noted")
@attrs.define(frozen=True)
class Noted:
    text: str


def _spec(db: Database, version: int):  # type: ignore[no-untyped-def]
    table = Table(
        f"{db.schema.prefix}decl_notes",
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
            conn, InstanceInfo(id=instance_id, name=instance_id, host="h", pid=1)
        )


def test_a_rebuild_fences_the_old_owner_and_empties_the_read_model(db: Database) -> None:
    """After a new declaration, the old owner's epoch can commit nothing; its writes are gone."""
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

    assert declare(db, v2, P, "new", instance_name="new").outcome == DeclarationOutcome.REBUILT

    with pytest.raises(OwnershipLost), db.transaction() as conn:
        ownership.commit_checkpoint(conn, "decl-notes", "old", held, 99)
    with db.read() as conn:
        rows = ownership.partitions(conn, ["decl-notes"])
        assert conn.execute(select(table)).all() == []
    assert {r.owner for r in rows} == {"new"}
    assert all(r.epoch > held[r.partition].epoch and r.checkpoint == 0 for r in rows)


def test_the_declaration_one_back_is_stale_and_does_not_rebuild(db: Database) -> None:
    """An instance still on the previous declaration is told to apply nothing."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.REBUILT
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED


def test_an_interrupted_rebuild_is_redone(db: Database) -> None:
    """A consumer left REBUILDING (crash mid-rebuild) is rebuilt again by the next start."""
    v1, table = _spec(db, 1)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    consumers = db.schema.consumers
    with db.transaction() as conn:
        conn.execute(insert(table), {"text": "half-rebuilt"})
        conn.execute(update(consumers).values(state="rebuilding"))
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.REBUILT
    with db.read() as conn:
        assert conn.execute(select(table)).all() == []
        assert conn.execute(select(consumers.c.state)).scalar_one() == "running"


def test_an_even_older_declaration_applies_nothing_and_does_not_rebuild_back(
    db: Database,
) -> None:
    """v1 → v2 → v3: an instance still on v1 is stale too, and the read model stays v3's."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    v3, _ = _spec(db, 3)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.REBUILT
    assert declare(db, v3, P, "a", instance_name="a").outcome == DeclarationOutcome.REBUILT
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
    assert declare(db, v3, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED


def test_a_requested_rebuild_rolls_back_to_a_left_behind_declaration(db: Database) -> None:
    """v1 → v2, then an operator asks for a rebuild: an instance starting on v1 rebuilds
    under v1, which is current again, and v2 is the one left behind."""
    v1, _ = _spec(db, 1)
    v2, _ = _spec(db, 2)
    _register(db, "a")
    declare(db, v1, P, "a", instance_name="a")
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.REBUILT
    operations.rebuild(db, "decl-notes", who="test", reason="roll back")
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.REBUILT
    assert declare(db, v1, P, "a", instance_name="a").outcome == DeclarationOutcome.UNCHANGED
    assert declare(db, v2, P, "a", instance_name="a").outcome == DeclarationOutcome.STALE
