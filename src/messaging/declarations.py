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
from sqlalchemy import Connection, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

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


def create_read_models(db: Database, spec: ConsumerSpec) -> None:
    """Create the consumer's read-model tables that do not exist yet.

    Runs in its own transactions, before the consumer's row is locked: on MySQL every
    DDL statement commits implicitly. A concurrent creation by another instance is not
    an error.
    """
    for read_model in spec.options.tables:
        try:
            with db.transaction() as conn:
                read_model.create(conn, checkfirst=True)
        except (OperationalError, ProgrammingError) as exc:
            with db.read() as conn:
                if not inspect(conn).has_table(read_model.name):
                    raise
            log.debug("read model %s created concurrently: %s", read_model.name, exc)


def declare(db: Database, spec: ConsumerSpec, distribution: Distribution) -> Declared:
    """Create the read models, record ``spec`` in the consumers table and create its
    partitions; or rebuild the consumer when its declaration changed."""
    create_read_models(db, spec)
    with db.transaction() as conn:
        return _record(db, conn, spec, distribution)


def _record(
    db: Database, conn: Connection, spec: ConsumerSpec, distribution: Distribution
) -> Declared:
    table = db.schema.consumers
    ownership = Ownership(db)
    fingerprint = spec.fingerprint()
    where = (table.c.tenant == db.tenant, table.c.name == spec.name)
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
    row = conn.execute(select(table.c.fingerprint).where(*where).with_for_update()).first()
    if row is None:
        try:
            with conn.begin_nested():
                conn.execute(insert(table).values(tenant=db.tenant, name=spec.name, **values))
        except IntegrityError:  # another instance declared it first: use its row
            row = conn.execute(select(table.c.fingerprint).where(*where).with_for_update()).one()
        else:
            ownership.ensure_partitions(conn, spec.name, spec.partitions)
            return Declared(consumer=spec.name, outcome="created", fingerprint=fingerprint)
    if row.fingerprint == fingerprint:
        conn.execute(update(table).where(*where).values(distribution=distribution.value))
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
