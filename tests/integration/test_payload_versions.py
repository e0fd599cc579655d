"""Versioned payloads: the version written on append, and every generation of a message
class read through its upcasters by projections (their type filter, rebuilds and versions
being built), on both backends."""

from __future__ import annotations

import json
from typing import Any

import pytest
import shapes_app
from clusters import consumer_worker
from shapes_app import EXPECTED, Sale, Sales, write_generations
from sqlalchemy import MetaData, insert, select

from messaging import Database, MessageStore, NewMessage
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from projections.testing import open_cluster

ME = "a1b2c3"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [shapes_app.metadata]


def _stored_versions(db: Database) -> list[tuple[str, int]]:
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(select(m.c.type, m.c.payload_version).order_by(m.c.position))
        return [(t, v) for t, v in rows]


def _sales(db: Database, prefix: str = "") -> list[Sale]:
    table = shapes_app.sales
    name = f"{prefix}{table.name}"
    with db.read() as conn:
        rows = conn.exec_driver_sql(
            f"SELECT order_id, amount, first_name, last_name, currency FROM {name} "
            "ORDER BY order_id"
        ).all()
    return [Sale(*row) for row in rows]


def _worker(db: Database) -> Any:
    with db.transaction() as conn:
        Membership(db).register(conn, InstanceInfo(id=ME, name="me", host="h", pid=1))
        Ownership(db).ensure_partitions(conn, "shop-sales", 4)
        claims = Ownership(db).claim(conn, "shop-sales", range(4), ME, Membership(db).live_ids(30))
        shapes_app.sales.create(conn, checkfirst=True)
    worker = consumer_worker(db, Sales, instance_id=ME)
    worker.add_claims(claims)
    return worker


def test_append_stores_the_class_version_and_old_rows_read_as_version_1(db: Database) -> None:
    """``append`` writes the class's declared version; an encoded message without one is
    version 1 (what rows stored before the column existed are)."""
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "shop", "s", [EXPECTED[0], shapes_app.Note("x")])
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
        "upcaster shapes_app.split_customer ('shop.order-placed' v1 -> 'shop.order-placed' v2)"
        in (halted[0].error or "")
    )
    assert "failed: KeyError: 'customer'" in (halted[0].error or "")
    assert len(_sales(db)) == 4


def test_a_version_newer_than_this_code_is_never_decoded(db: Database) -> None:
    """A payload of ``shop.sale`` version 3 (a newer instance's) is not applied nor skipped:
    its partition stops before it, saying which declaration it needs."""
    newer = NewMessage(
        topic="shop",
        source="o1",
        type="shop.sale",
        payload=json.dumps({"order_id": "o9", "amount": 1, "first_name": "a", "last_name": "b"}),
        payload_version=3,
    )
    with db.transaction() as conn:
        (position,) = MessageStore(db).append_encoded(conn, [newer])
    worker = _worker(db)
    while worker.poll():
        pass
    with db.read() as conn:
        stopped = [p for p in Ownership(db).partitions(conn, ["shop-sales"]) if p.error]
    assert [p.checkpoint for p in stopped] == [position - 1]
    assert _sales(db) == []
    assert "needs a newer declaration of type 'shop.sale' version 3" in (stopped[0].error or "")


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
