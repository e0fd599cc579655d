"""Versioned payloads: the version written on append, and every generation of a message
class read through its upcasters by projections (their type filter, rebuilds and versions
being built), on both backends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import shapes_app
import shapes_tables
from clusters import consumer_worker, write_config
from shapes_app import EXPECTED, Sale, Sales, write_generations
from sqlalchemy import MetaData, func, insert, select

from messaging import Database, MessageStore, NewMessage
from messaging._consumers import consumer_spec
from messaging._settings import ConsumerSettings, Distribution
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.versions._declarations import declare
from projections._reports import consumers_report, format_consumers
from projections.testing import open_cluster

ME = "a1b2c3"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [shapes_tables.metadata]


def _stored_versions(db: Database) -> list[tuple[str, int]]:
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(select(m.c.type, m.c.payload_version).order_by(m.c.position))
        return [(t, v) for t, v in rows]


def _sales(db: Database, prefix: str = "") -> list[Sale]:
    table = shapes_tables.sales
    name = f"{prefix}{table.name}"
    with db.read() as conn:
        rows = conn.exec_driver_sql(
            f"SELECT order_id, amount, first_name, last_name, currency FROM {name} "
            "ORDER BY order_id"
        ).all()
    return [Sale(*row) for row in rows]


def _worker(db: Database) -> Any:
    """A worker of Sales holding every partition, its consumer declared."""
    with db.transaction() as conn:
        Membership(db).register(conn, InstanceInfo(id=ME, name="me", host="h", pid=1))
    declare(db, consumer_spec(Sales), Distribution.PARTITIONED, ME, "me")
    with db.transaction() as conn:
        claims = Ownership(db).claim(conn, "shop-sales", range(4), ME, Membership(db).live_ids(30))
    worker = consumer_worker(db, Sales, instance_id=ME)
    worker.add_claims(claims)
    return worker


def test_append_stores_the_class_version_and_old_rows_read_as_version_1(db: Database) -> None:
    """``append`` writes the class's declared version; an encoded message without one is
    version 1 (what rows stored before the column existed are)."""
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "shop", "s", [EXPECTED[0], shapes_tables.Note("x")])
        store.append_encoded(conn, [NewMessage(topic="shop", source="s", type="t", payload="{}")])
    assert _stored_versions(db) == [("shop.sale", 2), ("shop.note", 1), ("t", 1)]
    with db.read() as conn:
        envelope = store.envelopes(conn, [1])[1]
    assert envelope.payload_version == 2


def test_a_projection_applies_every_generation_through_its_upcasters(db: Database) -> None:
    """Three generations and the current one, with notes of another type between them (so
    the SQL type filter runs, and reads the old type name too): each applied as the
    current class makes it from its upcast payload."""
    write_generations(db, times=3)
    worker = _worker(db)
    assert "shop.order-placed" in worker.dispatcher.type_names
    while worker.poll():
        pass
    expected = sorted(
        [
            Sale(
                f"{s.order_id}{f'-{r}' if r else ''}",
                s.amount,
                s.first_name,
                s.last_name,
                s.currency,
            )
            for r in range(3)
            for s in EXPECTED
        ],
        key=lambda s: s.order_id,
    )
    assert _sales(db) == expected
    with db.read() as conn:
        parts = Ownership(db).partitions(conn, ["shop-sales"])
    assert {p.status for p in parts} == {"running"}


def test_an_upcaster_that_fails_halts_its_message_naming_the_upcaster(db: Database) -> None:
    """A stored payload the upcaster cannot take (no ``customer``) halts its partition at
    that message; the reason names the upcaster; the other partitions go on."""
    write_generations(db)
    bad = NewMessage(
        topic="shop", source="o1", type="shop.order-placed", payload='{"order_id":"o9","amount":1}'
    )
    with db.transaction() as conn:
        (position,) = MessageStore(db).append_encoded(conn, [bad])
    worker = _worker(db)
    while worker.poll():
        pass
    with db.read() as conn:
        halted = [p for p in Ownership(db).partitions(conn, ["shop-sales"]) if p.status == "halted"]
    assert [p.halted_position for p in halted] == [position]
    assert (
        "upcaster shapes_tables.split_customer_name "
        "('shop.order-placed' v1 -> 'shop.order-placed' v2)" in (halted[0].error or "")
    )
    assert "failed: KeyError: 'customer'" in (halted[0].error or "")
    assert len(_sales(db)) == 4


def test_a_version_newer_than_this_code_is_never_decoded(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A payload of ``shop.sale`` version 3 (a newer instance's) is neither applied, nor
    skipped, nor halted on: its partition stops right before it, records what it needs
    and is released (to an instance that can read it), saying so once."""
    write_generations(db)
    newer = NewMessage(
        topic="shop",
        source="o1",
        type="shop.sale",
        payload=json.dumps({"order_id": "o9", "cents": 1, "first_name": "a", "last_name": "b"}),
        payload_version=3,
    )
    behind = Sale("o11", 1, "a", "b")  # after it in its partition (same source)
    with db.transaction() as conn:
        (position,) = MessageStore(db).append_encoded(conn, [newer])
        MessageStore(db).append(conn, "shop", "o1", [behind])
    worker = _worker(db)
    while worker.poll():
        pass
    while worker.poll():
        pass
    with db.read() as conn:
        parts = Ownership(db).partitions(conn, ["shop-sales"])
    stopped = [p for p in parts if p.needs]
    assert len(stopped) == 1
    assert stopped[0].owner is None and stopped[0].status == "running"
    assert stopped[0].checkpoint < position and stopped[0].error is None
    assert json.loads(stopped[0].needs or "") == {
        "type": "shop.sale",
        "version": 3,
        "position": position,
    }
    applied = {s.order_id for s in _sales(db)}
    assert applied == {"o1", "o2", "o3", "o4"}  # not o9, nor o11 behind it
    report = consumers_report(db, ConsumerSettings())
    (sales,) = [c for c in report["consumers"] if c["name"] == "shop-sales"]
    waiting = [p for p in sales["partitions"] if "waiting" in p]
    assert [p["partition"] for p in waiting] == [stopped[0].partition]
    assert waiting[0]["waiting"] == "needs a newer declaration of type 'shop.sale' version 3"
    assert "waiting: it needs a newer declaration" in format_consumers(report)
    said = [r.getMessage() for r in caplog.records if "needs a newer declaration" in r.getMessage()]
    assert len(said) == 1
    assert "needs a newer declaration of type 'shop.sale' version 3" in said[0]


def test_a_rebuild_and_a_lagging_instance_read_every_generation(
    projections_database_url: str | None,
) -> None:
    """In a cluster of two instances, every generation is applied; a rebuild builds a new
    version from the same old payloads, which takes over with the same rows."""
    with open_cluster([Sales], database_url=projections_database_url) as cluster:
        write_generations(cluster.db, times=2)
        cluster.join()
        cluster.join()
        cluster.settle()
        first = _sales(cluster.db)
        assert len(first) == 8 and first[0] == EXPECTED[0]
        cluster.rebuild()
        cluster.settle()
        assert _sales(cluster.db) == first
        with cluster.db.read() as conn:
            versions = conn.execute(
                select(cluster.db.schema.consumers.c.version).where(
                    cluster.db.schema.consumers.c.name == "shop-sales"
                )
            ).scalar_one()
        assert versions == 2


def test_rows_inserted_before_the_column_existed_read_as_version_1(db: Database) -> None:
    """A row written by older code (no payload version given) is version 1."""
    m = db.schema.messages
    with db.transaction() as conn:
        conn.execute(
            insert(m).values(
                tenant=db.tenant,
                position=1,
                topic="shop",
                source="o1",
                version=1,
                type="shop.order-placed",
                payload=json.dumps(shapes_app.GENERATIONS[0][2]),
                partition_hash=0,
                recorded_at=0.0,
            )
        )
        conn.execute(db.schema.positions.update().values(last_position=1))
    assert _stored_versions(db) == [("shop.order-placed", 1)]
    worker = _worker(db)
    while worker.poll():
        pass
    assert _sales(db) == [EXPECTED[0]]


def test_an_instance_refuses_to_start_on_a_chain_with_a_gap(db: Database) -> None:
    """The chains are checked at start-up: one line naming the type, nothing registered."""
    from messaging import Instance, RegistrationError, Settings, create_plugin_manager
    from messaging._messages import MessageRegistry

    registry = MessageRegistry()
    registry.register(Sale, "shop.sale", 3)
    hooks = create_plugin_manager([], load_entrypoints=False).hook
    instance = Instance(db, [], Settings(), hooks, registry=registry)
    with pytest.raises(RegistrationError) as info:
        instance.start(loops=False)
    assert str(info.value) == (
        "message type 'shop.sale' is at version 3 but no upcaster reads its version 1: "
        "declare @upcaster('shop.sale', 1)"
    )
    with db.read() as conn:
        assert Membership(db).instances(conn, 30) == []


def test_a_route_consumer_and_a_saga_read_every_generation(
    projections_database_url: str | None,
) -> None:
    """Sent raw as each generation sent them, the sales are billed by the route consumer
    as the current class reads them; the saga starts one instance per sale from the
    upcast payloads too."""
    consumers = [shapes_app.Invoices, shapes_app.Customers]
    with open_cluster(consumers, database_url=projections_database_url) as cluster:
        db = cluster.db
        shapes_app.send_generations(db)
        write_generations(db)
        cluster.join()
        cluster.settle()
        with db.read() as conn:
            billed: dict[str, str] = dict(conn.execute(select(shapes_app.invoices)).all())
            sagas = db.schema.sagas
            states = conn.execute(select(sagas.c.saga_key, sagas.c.state)).all()
    assert billed == {
        s.order_id: f"{s.first_name} {s.last_name}: {s.amount} {s.currency}" for s in EXPECTED
    }
    assert sorted((key, json.loads(state)) for key, state in states) == [
        (s.order_id, {"name": f"{s.first_name} {s.last_name}", "spent": s.amount}) for s in EXPECTED
    ]


def test_a_halted_old_message_is_read_through_its_upcasters_when_retried(
    projections_database_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old message whose upcaster failed (a bug) halts; once the upcaster is fixed, a
    resume applies it from its upcast payload, and the partition goes on."""
    from projections import _operations as operations

    monkeypatch.setattr(shapes_tables, "BUGGY", {"o2"})
    with open_cluster([Sales], database_url=projections_database_url) as cluster:
        db = cluster.db
        write_generations(db)
        cluster.join()
        cluster.settle()
        with db.read() as conn:
            parts = Ownership(db).partitions(conn, ["shop-sales"])
        halted = [p for p in parts if p.status == "halted"]
        assert len(halted) == 1 and "split_customer_name" in (halted[0].error or "")
        assert "o2" not in {s.order_id for s in _sales(db)}

        monkeypatch.setattr(shapes_tables, "BUGGY", set())
        operations.resume(db, "shop-sales", who="test")
        cluster.settle()
        assert _sales(db) == EXPECTED


def test_append_input_may_give_an_older_version_read_through_the_upcasters(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``projections append --module``: a line without ``version`` is of its class's
    current version; an older one is checked through its upcasters and stored as given; a
    version newer than the code, or a payload its upcaster cannot take, is one line and
    nothing of its batch is written."""
    from projections.cli import main

    config = write_config(tmp_path / "c.yaml", db)
    old = {"order_id": "o1", "amount": 1, "customer": "Ada Lovelace"}
    current = {"order_id": "o2", "amount": 2, "first_name": "A", "last_name": "L"}

    def append(*lines: dict[str, Any]) -> int:
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        args = ["append", str(path), "--config", str(config), "--module", "shapes_app"]
        return main(args)

    line = {"topic": "shop", "source": "s", "type": "shop.order-placed", "payload": old}
    assert append({**line, "version": 1}, {**line, "type": "shop.sale", "payload": current}) == 0
    assert _stored_versions(db) == [("shop.order-placed", 1), ("shop.sale", 2)]
    capsys.readouterr()

    assert append({**line, "type": "shop.sale", "payload": current, "version": 3}) == 1
    err = capsys.readouterr().err
    assert "needs a newer declaration of type 'shop.sale' version 3" in err
    assert len(err.strip().splitlines()) == 1
    assert append({**line, "version": 1, "payload": {"order_id": "o3", "amount": 1}}) == 1
    assert "split_customer_name" in capsys.readouterr().err
    assert append({**line, "version": 0}) == 1
    assert "'version' must be an integer of at least 1" in capsys.readouterr().err
    assert len(_stored_versions(db)) == 2


def test_messages_check_lists_every_stored_shape_and_fails_on_one_no_class_reaches(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``projections messages check``: each (topic, type, version) with its count and the
    way to its class; exit 0 while every one reaches a current class, 1 (naming it) once
    a newer one is stored."""
    from projections.cli import main

    write_generations(db, times=2)
    config = write_config(tmp_path / "c.yaml", db)
    args = ["messages", "check", "shapes_app", "--config", str(config)]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [
        (e["topic"], e["type"], e["version"], e["count"], e["reaches"]) for e in report["shapes"]
    ] == [
        ("shop", "shop.note", 1, 8, "shop.note v1"),
        ("shop", "shop.order-placed", 1, 4, "shop.sale v2"),
        ("shop", "shop.order-placed", 2, 2, "shop.sale v2"),
        ("shop", "shop.sale", 2, 2, "shop.sale v2"),
    ]
    assert report["shapes"][1]["via"] == [
        "upcaster shapes_tables.split_customer_name "
        "('shop.order-placed' v1 -> 'shop.order-placed' v2)",
        "rename 'shop.order-placed' -> 'shop.sale'",
    ]
    newer = NewMessage(topic="shop", source="s", type="shop.sale", payload="{}", payload_version=3)
    with db.transaction() as conn:
        MessageStore(db).append_encoded(conn, [newer])
    assert main(args) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "1 stored shape(s) reach no current class"
    assert (
        "shop shop.sale v3: 1  UNREADABLE: needs a newer declaration of type 'shop.sale' version 3"
        in out
    )


def _store_state(db: Database, key: str, state: dict[str, Any], state_version: int) -> None:
    """A state row of the loyalty saga as an older (or newer) version of it stored it."""
    with db.transaction() as conn:
        conn.execute(
            insert(db.schema.sagas).values(
                tenant=db.tenant,
                saga="shop-loyalty",
                saga_key=key,
                version=1,
                state=json.dumps(state),
                ended=False,
                started_at=0.0,
                updated_at=0.0,
                state_version=state_version,
            )
        )


def test_a_saga_reads_a_state_stored_at_an_older_version_through_its_upcaster(
    projections_database_url: str | None,
) -> None:
    """A state stored at state version 1 is upcast when its next message comes, and
    stored back at version 2; one stored at version 3 (a newer instance's) is never read:
    its partition waits, saying what it needs."""
    with open_cluster([shapes_app.Loyalty], database_url=projections_database_url) as cluster:
        db = cluster.db
        _store_state(db, "o1", {"name": "Ada Lovelace", "score": 5}, 1)
        _store_state(db, "o3", {"customer": "Grace Hopper", "points": 1, "tier": "gold"}, 3)
        write_generations(db)
        cluster.join()
        cluster.settle()
        sagas = db.schema.sagas
        with db.read() as conn:
            rows = conn.execute(
                select(sagas.c.saga_key, sagas.c.state, sagas.c.state_version, sagas.c.version)
            ).all()
            parts = Ownership(db).partitions(conn, ["shop-loyalty"])
    states = {key: (json.loads(state), sv, v) for key, state, sv, v in rows}
    assert states["o1"] == ({"customer": "Ada Lovelace", "points": 15}, 2, 2)
    assert states["o3"] == ({"customer": "Grace Hopper", "points": 1, "tier": "gold"}, 3, 1)
    waiting = [p for p in parts if p.needs]
    assert len(waiting) == 1 and waiting[0].status == "running"
    assert json.loads(waiting[0].needs or "")["type"] == "saga-state:shop-loyalty"


def test_a_saga_whose_state_version_has_no_upcaster_is_refused(db: Database) -> None:
    """A saga at state_version 3 with an upcaster from version 1 only: one line naming it."""
    from messaging import RegistrationError
    from messaging._messages import registry
    from sagas import saga, start
    from sagas._dispatch import SagaDispatcher

    @saga(
        "shop-gap", topics="shop", correlate_by="order_id", state=shapes_app.Points, state_version=3
    )
    class Gap:
        @start
        def sale(self, sale: Sale, ctx: Any) -> None:
            pass

    with pytest.raises(RegistrationError) as info:
        SagaDispatcher(consumer_spec(Gap), registry, db)
    assert str(info.value).startswith(
        "saga 'shop-gap' is at state_version=3 but its stored state version 1 cannot be read"
    )


def test_a_saga_deadline_stored_at_an_older_version_is_delivered_upcast(
    projections_database_url: str | None,
) -> None:
    """A deadline scheduled by older code (an old type name and payload version) is
    delivered as the current class reads it."""
    from messaging.store._rows import partition_of

    with open_cluster([shapes_app.Loyalty], database_url=projections_database_url) as cluster:
        db = cluster.db
        _store_state(db, "o1", {"customer": "Ada Lovelace", "points": 1}, 2)
        with db.transaction() as conn:
            conn.execute(
                insert(db.schema.deadlines).values(
                    tenant=db.tenant,
                    saga="shop-loyalty",
                    saga_key="o1",
                    name="bonus",
                    partition_no=partition_of("o1", 4),
                    due_at=0.0,
                    type="shop.order-placed",
                    payload=json.dumps(shapes_app.GENERATIONS[0][2]),
                    scheduled_at=0.0,
                    payload_version=1,
                )
            )
        cluster.join()
        cluster.settle()
        with db.read() as conn:
            sagas = db.schema.sagas
            state = conn.execute(select(sagas.c.state).where(sagas.c.saga_key == "o1")).scalar()
            left = conn.execute(select(func.count()).select_from(db.schema.deadlines)).scalar()
    assert json.loads(state or "") == {"customer": "Ada Lovelace", "points": 11}
    assert left == 0


@pytest.mark.parametrize(
    ("stored", "named"),
    [
        ({"customer": "Ada Lovelace", "points": 1, "tier": "gold"}, "tier"),  # newer code's
        ({"customer": "Ada Lovelace"}, "points"),  # a field added without a state version
    ],
    ids=["unknown-field", "missing-field"],
)
def test_a_stored_state_this_code_cannot_read_halts_its_partition_naming_the_field(
    projections_database_url: str | None, stored: dict[str, Any], named: str
) -> None:
    """A state stored at the current state version that does not fit the state class (a
    field it lacks, or one it does not know: never dropped) halts only its partition, with
    one line naming the saga instance, the field and the fix."""
    from messaging.store._rows import partition_of

    with open_cluster([shapes_app.Loyalty], database_url=projections_database_url) as cluster:
        db = cluster.db
        _store_state(db, "o1", stored, 2)
        write_generations(db)
        cluster.join()
        cluster.settle()  # ends with the poll that halted (it applied nothing)
        cluster.settle()
        with db.read() as conn:
            parts = Ownership(db).partitions(conn, ["shop-loyalty"])
            keys = set(conn.execute(select(db.schema.sagas.c.saga_key)).scalars())
    (halted,) = [p for p in parts if p.status == "halted"]
    assert halted.partition == partition_of("o1", 4)
    error = halted.error or ""
    assert "\n" not in error and named in error, error
    assert "saga 'shop-loyalty' instance 'o1'" in error and "state_version=3" in error, error
    assert "@state_upcaster('shop-loyalty', 2)" in error, error
    others = {key for key in ("o2", "o3", "o4") if partition_of(key, 4) != halted.partition}
    assert others and others <= keys  # the other partitions went on


GAP_MODULE = """
import attrs
from messaging import message, upcaster

@message("gap.thing", version=3)
@attrs.define(frozen=True)
class Thing:
    name: str

@upcaster("gap.thing", 1)
def one_to_two(payload):
    return payload
"""


def test_messages_check_with_a_gap_in_the_upcasters_still_lists_every_shape(
    db: Database, tmp_path: Path
) -> None:
    """A class at version 3 whose upcasters stop at version 2: ``messages check`` lists the
    stored shapes (as text and as JSON) and names the gap, exit 1, where it used to print
    the error alone (and no JSON with ``--json``)."""
    (tmp_path / "gapmod.py").write_text(GAP_MODULE, encoding="utf-8")
    stored = NewMessage(topic="t", source="s", type="gap.thing", payload="{}", payload_version=1)
    with db.transaction() as conn:
        MessageStore(db).append_encoded(conn, [stored])
    config = write_config(tmp_path / "c.yaml", db)
    command = [sys.executable, "-m", "projections.cli", "messages", "check", "gapmod"]
    command += ["--app-dir", str(tmp_path), "--config", str(config)]
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert [(e["type"], e["version"], e["count"]) for e in report["shapes"]] == [
        ("gap.thing", 1, 1)
    ]
    assert "'gap.thing'" in report["declaration"] and report["ok"] is False
    as_text = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert as_text.returncode == 1, as_text.stderr
    lines = as_text.stdout.splitlines()
    assert lines[0].startswith("t gap.thing v1: 1  UNREADABLE: ")
    assert lines[-1] == f"the declarations do not hold together: {report['declaration']}"
