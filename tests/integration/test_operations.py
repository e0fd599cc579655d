"""Operator commands on a cluster of two instances: pause, resume, resume past a poison
message and rebuild take effect within one poll on every instance, and are audited."""

from __future__ import annotations

import json
from collections.abc import Iterator

import attrs
import pytest
from admin_schemas import CONSUMERS, check
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert, select

from messaging import Database, HandlerContext, MessageStore, Settings, handler, message
from messaging._errors import OperationError
from messaging._settings import ConsumerSettings
from messaging.distribution._ownership import Ownership
from messaging.store._clock import ManualClock
from projections import projection
from projections._operations import audit_log, pause, rebuild, recorded_detail, resume
from projections._reports import consumers_report
from projections._version_commands import drop_version, rollback
from projections.testing import SimulatedCluster

metadata = MetaData()
notes = Table(
    "ops_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("position", BigInteger, nullable=False),
    Column("text", String(50), nullable=False),
)
POISONED = {"enabled": True}


@message("test.ops.noted")
@attrs.define(frozen=True)
class Noted:
    text: str


@projection("ops-notes", topics="ops", partitions=4, tables=[notes])
class Notes:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        if event.text == "poison" and POISONED["enabled"]:
            raise ValueError("refusing poison")
        ctx.execute(insert(notes), {"position": ctx.envelope.position, "text": event.text})


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [metadata]


@pytest.fixture
def cluster(database_url: str, table_prefix: str, db: Database) -> Iterator[SimulatedCluster]:
    """Two in-process instances of Notes, a manual clock, on the test's database."""
    clocked = Database(database_url, table_prefix=table_prefix, clock=ManualClock())
    POISONED["enabled"] = True
    simulated = SimulatedCluster(clocked, [Notes], Settings())
    simulated.join("a")
    simulated.join("b")
    for _ in range(3):
        simulated.tick()
    yield simulated
    for name in list(simulated.running):
        simulated.stop(name)
    clocked.dispose()


def _append(db: Database, *texts: str) -> None:
    with db.transaction() as conn:
        for n, text in enumerate(texts):
            MessageStore(db).append(conn, "ops", f"source-{n % 5}", [Noted(text)])


def _texts(db: Database) -> list[str]:
    with db.read() as conn:
        return sorted(conn.execute(select(notes.c.text)).scalars())


def _drain(cluster: SimulatedCluster) -> None:
    while cluster.poll_all():
        pass


def test_pause_stops_every_instance_within_one_poll_and_resume_continues(
    cluster: SimulatedCluster,
) -> None:
    """After pause nothing is applied anywhere, even by owners that still hold claims."""
    db = cluster.db
    _append(db, "one", "two")
    _drain(cluster)
    pause(db, "ops-notes", who="ops@test", reason="maintenance")
    _append(db, "three", "four", "five")
    assert cluster.poll_all() == 0  # the very next poll: fenced
    cluster.tick()
    assert cluster.poll_all() == 0
    with pytest.raises(OperationError, match="already paused"):
        pause(db, "ops-notes", who="ops@test")
    resume(db, "ops-notes", who="ops@test", reason="done")
    cluster.tick()
    _drain(cluster)
    assert _texts(db) == sorted(["one", "two", "three", "four", "five"])
    log = audit_log(db, "ops-notes")
    assert [(e["command"], e["who"], e["detail"]["reason"]) for e in log] == [
        ("pause", "ops@test", "maintenance"),
        ("resume", "ops@test", "done"),
    ]


def test_resume_past_the_poison_skips_exactly_that_message(cluster: SimulatedCluster) -> None:
    """The halted message is skipped (and recorded); everything else is applied once."""
    db = cluster.db
    _append(db, "a", "b", "poison", "c", "d", "e", "f")
    _drain(cluster)
    with db.read() as conn:
        halted = [p for p in Ownership(db).partitions(conn, ["ops-notes"]) if p.status == "halted"]
    assert len(halted) == 1 and halted[0].halted_type == "test.ops.noted"
    assert "poison" not in _texts(db)
    report = check(json.loads(json.dumps(consumers_report(db, ConsumerSettings()))), CONSUMERS)
    (reported,) = [
        p["halted"] for c in report["consumers"] for p in c["partitions"] if "halted" in p
    ]
    assert reported["position"] == halted[0].halted_position

    skipped = resume(db, "ops-notes", who="ops@test", skip_poison=True, reason="bad data")
    assert [s["position"] for s in skipped] == [halted[0].halted_position]
    cluster.tick()
    _drain(cluster)
    assert _texts(db) == sorted(["a", "b", "c", "d", "e", "f"])
    (entry,) = [e for e in audit_log(db) if e["command"] == "resume --skip-poison"]
    assert entry["detail"]["halted"][0]["position"] == halted[0].halted_position


def test_resume_without_skipping_retries_the_poison_message(cluster: SimulatedCluster) -> None:
    """Once the handler is fixed, a plain resume applies the halted message itself."""
    db = cluster.db
    _append(db, "a", "poison", "b")
    _drain(cluster)
    POISONED["enabled"] = False
    resume(db, "ops-notes", who="ops@test")
    cluster.tick()
    _drain(cluster)
    assert _texts(db) == sorted(["a", "poison", "b"])


def test_rebuild_replays_the_read_model_from_scratch(cluster: SimulatedCluster) -> None:
    """A rebuild builds a new version beside the live one (junk included, read until the
    cutover), which replays every message once and takes over."""
    db = cluster.db
    _append(db, "a", "b", "c")
    _drain(cluster)
    with db.transaction() as conn:
        conn.execute(insert(notes), {"position": 999, "text": "junk"})
    rebuild(db, "ops-notes", who="ops@test", reason="junk")
    with pytest.raises(OperationError, match="already being rebuilt"):
        rebuild(db, "ops-notes", who="ops@test")
    assert cluster.poll_all() == 0
    cluster.tick()  # the first instance to see the request starts a version
    assert _texts(db) == ["a", "b", "c", "junk"]
    with pytest.raises(OperationError, match="already being rebuilt: ops-notes@2"):
        rebuild(db, "ops-notes", who="ops@test")
    with pytest.raises(OperationError, match="'ops-notes@2' is version 2 of 'ops-notes'"):
        rebuild(db, "ops-notes@2", who="ops@test")
    for _ in range(10):
        cluster.tick()  # claims, then the cutover's steps
        _drain(cluster)
        if _live_version(db) == 2:
            break
    assert _live_version(db) == 2
    assert _texts(db) == ["a", "b", "c"]
    _append(db, "d")
    cluster.tick()
    _drain(cluster)
    assert _texts(db) == ["a", "b", "c", "d"]


def _live_version(db: Database) -> int:
    c = db.schema.consumers
    with db.read() as conn:
        version = conn.execute(select(c.c.version).where(c.c.name == "ops-notes")).scalar_one()
    return int(version or 1)


def test_unknown_consumers_and_invalid_transitions_are_refused(cluster: SimulatedCluster) -> None:
    """Each refusal names the consumer and why."""
    db = cluster.db
    with pytest.raises(OperationError, match="unknown consumer 'nope'; known consumers: ops-notes"):
        pause(db, "nope", who="x")
    with pytest.raises(OperationError, match="'ops-note'; did you mean 'ops-notes'"):
        pause(db, "ops-note", who="x")
    with pytest.raises(OperationError, match="running and has no halted partition"):
        resume(db, "ops-notes", who="x")
    with pytest.raises(OperationError, match="no halted partition to skip"):
        resume(db, "ops-notes", who="x", skip_poison=True)
    assert audit_log(db) == []


def test_a_retried_command_finds_its_entry_by_the_indexed_command_id_column(db: Database) -> None:
    """The retry's lookup reads the ``command_id`` column (an id only inside an entry's detail,
    as written before schema V9, is not searched), by an equality the index answers; the
    audit log shows both kinds of entry with their id."""
    a = db.schema.audit
    entry = {"tenant": db.tenant, "at": 0.0, "who": "ops", "command": "pause", "consumer": "c"}
    with db.transaction() as conn:
        conn.execute(
            insert(a),
            [
                {**entry, "detail": json.dumps({"command_id": "old-id"}), "command_id": None},
                {**entry, "detail": json.dumps({"reason": "r"}), "command_id": "new-id"},
            ],
        )
    assert recorded_detail(db, "new-id") == {"reason": "r"}
    assert recorded_detail(db, "old-id") is None
    assert [(e["command_id"], e["detail"]) for e in audit_log(db, "c")] == [
        ("old-id", {}),
        ("new-id", {"reason": "r"}),
    ]
    lookup = select(a.c.detail).where(a.c.tenant == db.tenant, a.c.command_id == "new-id")
    sql = str(lookup.compile(db.engine, compile_kwargs={"literal_binds": True}))
    with db.read() as conn:
        if db.is_sqlite:
            plan = [str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]
        else:
            plan = [str(row.key) for row in conn.exec_driver_sql(f"EXPLAIN {sql}")]
    assert any(f"{db.schema.prefix}ix_audit_command" in step for step in plan), plan


def test_rollback_and_drop_version_refuse_what_does_not_fit(cluster: SimulatedCluster) -> None:
    """Each refusal says why and changes nothing; a rollback the cluster can do goes back
    to the replaced version (equal read model), audited with the versions."""
    db = cluster.db
    _append(db, "a", "b")
    _drain(cluster)
    with pytest.raises(OperationError, match="no retired version to roll back to"):
        rollback(db, "ops-notes", who="x")
    with pytest.raises(OperationError, match="unknown consumer 'nope'"):
        rollback(db, "nope", who="x")
    rebuild(db, "ops-notes", who="x")
    with pytest.raises(OperationError, match="a rebuild of 'ops-notes' was requested"):
        rollback(db, "ops-notes", who="x")
    cluster.tick()
    with pytest.raises(OperationError, match="being built: ops-notes@2; roll back once"):
        rollback(db, "ops-notes", who="x")
    with pytest.raises(OperationError, match="'ops-notes@2' is version 2 of 'ops-notes'"):
        rollback(db, "ops-notes@2", who="x")
    with pytest.raises(OperationError, match="version 2 of 'ops-notes' is building"):
        drop_version(db, "ops-notes", 2, who="x")
    cluster.settle()
    assert _live_version(db) == 2
    with pytest.raises(OperationError, match="version 2 of 'ops-notes' is live"):
        drop_version(db, "ops-notes", 2, who="x")
    _append(db, "c")
    assert rollback(db, "ops-notes", who="x", reason="back") == 1
    cluster.settle()
    assert _live_version(db) == 1
    assert _texts(db) == ["a", "b", "c"]
    entries = [(e["command"], e["detail"]) for e in audit_log(db)]
    assert entries[-1] == ("rollback", {"from": 2, "reason": "back", "to": 1})
    assert drop_version(db, "ops-notes", 2, who="x") == ["_v2__ops_notes"]
