"""An in-memory projection's copy that meets a payload newer than its instance's code: it
stops before it, says why once, neither applies, skips nor halts at it, and the reports
show why it waits; on both backends."""

from __future__ import annotations

import json
import logging

import pytest
import shapes_tables
from shapes_app import Sale, write_generations
from sqlalchemy import MetaData

from messaging import Database, MessageStore, NewMessage, Settings, create_plugin_manager, handler
from messaging._consumers import consumer_spec
from messaging._messages import registry
from messaging.applying._in_memory import InMemoryConsumer, InMemoryOperationError
from messaging.distribution._membership import InstanceInfo, Membership
from projections import in_memory_projection
from projections._reports import consumers_report, format_consumers

NEWER = "needs a newer declaration of type 'shop.sale' version 3"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [shapes_tables.metadata]


@in_memory_projection("shop-sale-names", topics=shapes_tables.TOPIC)
class SaleNames:
    def __init__(self) -> None:
        self.names: list[str] = []

    @handler
    def sale(self, sale: Sale) -> None:
        self.names.append(f"{sale.first_name} {sale.last_name}")


def _newer_sale(db: Database) -> int:
    """Append one ``shop.sale`` at version 3, as a newer instance writes it; its position."""
    payload = {"order_id": "n1", "cents": 5, "first_name": "New", "last_name": "Er"}
    message = NewMessage(
        topic=shapes_tables.TOPIC,
        source="n1",
        type="shop.sale",
        payload=json.dumps(payload),
        payload_version=3,
    )
    with db.transaction() as conn:
        [position] = MessageStore(db).append_encoded(conn, [message])
    return position


def test_an_in_memory_copy_waits_before_a_payload_newer_than_its_code(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Four older sales are applied; the copy stops before the version 3 one (and the
    older ones after it), says so once, refuses to be resumed past it, shows why in the
    reports; a rebuild stops there again."""
    write_generations(db)
    newer = _newer_sale(db)
    write_generations(db, first=1)  # older messages after it: not applied past it
    copy = InMemoryConsumer(
        db=db,
        spec=consumer_spec(SaleNames),
        instance_id="me",
        settings=Settings().messaging.consumer,
        hooks=create_plugin_manager([], load_entrypoints=False).hook,
        registry=registry,
    )
    with caplog.at_level(logging.WARNING, logger="messaging.runtime.in_memory"):
        for _ in range(3):
            copy.poll()
    assert copy.target.names == ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra"]
    assert copy.position < newer and copy.state == "waiting" and copy.halted is None
    assert [r.getMessage() for r in caplog.records if NEWER in r.getMessage()] == [
        f"in-memory consumer shop-sale-names stops before position {newer} on this "
        f"instance: it {NEWER}; only instances with one apply it (to their own copies)"
    ]
    snapshot = copy.snapshot()
    assert snapshot["state"] == "waiting"
    assert snapshot["waiting"] == {
        "position": newer,
        "type": "shop.sale",
        "version": 3,
        "reason": NEWER,
    }
    for skip in (False, True):  # never skipped, never retried into a loop
        with pytest.raises(InMemoryOperationError, match="never skipped"):
            copy.resume(skip_poison=skip)
    with db.transaction() as conn:
        Membership(db).register(conn, InstanceInfo(id="me", name="me", host="h", pid=1))
        Membership(db).publish_in_memory(conn, "me", {"consumers": {"shop-sale-names": snapshot}})
    report = consumers_report(db, Settings().messaging.consumer)
    [entry] = report["in_memory"][0]["instances"]
    assert entry["state"] == "waiting" and entry["waiting"]["reason"] == NEWER
    assert f"waiting at position {newer}: it {NEWER}" in format_consumers(report)
    copy.rebuild()  # starts over, and stops at the same message again
    copy.poll()
    assert copy.state == "waiting" and len(copy.target.names) == 4
