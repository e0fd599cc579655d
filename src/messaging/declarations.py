"""Consumer declarations in the database: the ``consumers`` table and read-model tables.

A consumer's fingerprint covers its version, topics, handled types, partition count
and read-model schema. When an instance starts with a declaration the database has not
seen, the consumer is rebuilt: its read models are dropped and recreated, its
partitions reset to checkpoint 0, and the old fingerprint kept as the one back.
"""

from __future__ import annotations

import json
import logging

import attrs
from sqlalchemy import Connection, insert, select, update

from messaging.consumers import ConsumerSpec
from messaging.database import Database
from messaging.ownership import Ownership
from messaging.settings import Distribution

log = logging.getLogger("messaging.declarations")

STATE_RUNNING = "running"


@attrs.define(frozen=True, kw_only=True)
class Declared:
    """What :func:`declare` found: whether the consumer is new, unchanged or rebuilt."""

    consumer: str
    outcome: str  # "created", "unchanged" or "rebuilt"
    fingerprint: str


def declare(
    db: Database, conn: Connection, spec: ConsumerSpec, distribution: Distribution
) -> Declared:
    """Record ``spec`` in the consumers table; create or rebuild its tables and partitions."""
    table = db.schema.consumers
    ownership = Ownership(db)
    fingerprint = spec.fingerprint()
    where = (table.c.tenant == db.tenant, table.c.name == spec.name)
    row = conn.execute(select(table.c.fingerprint).where(*where).with_for_update()).first()
    values = {
        "kind": spec.kind.value,
        "distribution": distribution.value,
        "partitions": spec.partitions,
        "topics": json.dumps(sorted(spec.topics)),
        "types": json.dumps(spec.type_names()),
        "fingerprint": fingerprint,
        "state": STATE_RUNNING,
        "updated_at": db.clock.now(),
    }
    if row is None:
        conn.execute(insert(table).values(tenant=db.tenant, name=spec.name, **values))
        for read_model in spec.options.tables:
            read_model.create(conn, checkfirst=True)
        ownership.ensure_partitions(conn, spec.name, spec.partitions)
        return Declared(consumer=spec.name, outcome="created", fingerprint=fingerprint)
    if row.fingerprint == fingerprint:
        for read_model in spec.options.tables:
            read_model.create(conn, checkfirst=True)
        ownership.ensure_partitions(conn, spec.name, spec.partitions)
        return Declared(consumer=spec.name, outcome="unchanged", fingerprint=fingerprint)
    log.warning(
        "consumer %s: declaration changed (%s -> %s); rebuilding its read models from the start",
        spec.name,
        row.fingerprint,
        fingerprint,
    )
    for read_model in reversed(spec.options.tables):
        read_model.drop(conn, checkfirst=True)
    for read_model in spec.options.tables:
        read_model.create(conn)
    ownership.reset(conn, spec.name, spec.partitions)
    conn.execute(update(table).where(*where).values(previous_fingerprint=row.fingerprint, **values))
    return Declared(consumer=spec.name, outcome="rebuilt", fingerprint=fingerprint)
