"""Consumer declarations in the database: the ``consumers`` table and read-model tables.

A consumer's fingerprint covers its version, topics, handled types, partition count
and read-model schema. When an instance starts with a declaration the database has not
seen, it rebuilds the consumer: in one transaction it records the new fingerprint
(keeping the old one as the one back), marks the consumer REBUILDING, and takes every
partition for itself under a new epoch with checkpoint 0, which fences off every
instance still applying the old declaration. Then it drops and recreates the read
models (outside that transaction: DDL commits implicitly on MySQL) and marks the
consumer running, replaying up to the head position of that moment (its rebuild target:
reports show it REBUILDING until its checkpoints reach it). A crash in between leaves it
REBUILDING, and the next start redoes the rebuild. An instance that starts with a
declaration the consumer has left behind (the one back, or any older one) applies
nothing and says which, unless an operator requested a rebuild: then it rebuilds under
its declaration (a roll back). A declaration never seen before is new, and rebuilds.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
from sqlalchemy import Connection, and_, insert, inspect, or_, select, update
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from messaging._consumers import ConsumerSpec
from messaging._errors import RegistrationError
from messaging._messages import MessageRegistry
from messaging._messages import registry as default_registry
from messaging._settings import Distribution
from messaging._states import ConsumerState, DeclarationOutcome
from messaging.distribution._ownership import Ownership
from messaging.distribution._pulse import bump_generation
from messaging.runtime._lifecycle import lifecycle_event
from messaging.store._database import Database
from messaging.store._store import MessageStore
from messaging.store._table_registry import register

log = logging.getLogger("messaging.runtime.declarations")


@attrs.define(frozen=True, kw_only=True)
class Declared:
    """What :func:`declare` found: the consumer is new, unchanged, rebuilt, or stale here."""

    consumer: str
    outcome: DeclarationOutcome
    fingerprint: str


def create_read_models(db: Database, spec: ConsumerSpec) -> None:
    """Register the tenant's physical read-model tables of the consumer (refused if
    another tenant owns one) and create those that do not exist yet.

    Each table in its own transaction (DDL commits implicitly on MySQL); a concurrent
    creation by another instance is not an error.
    """
    tables = db.read_models.tables(spec.options.tables)
    if tables:
        with db.transaction() as conn:
            register(db, conn, spec.name, tables)
    for read_model in tables:
        try:
            with db.transaction() as conn:
                read_model.create(conn, checkfirst=True)
        except (OperationalError, ProgrammingError) as exc:
            with db.read() as conn:
                if not inspect(conn).has_table(read_model.name):
                    raise
            log.debug("read model %s created concurrently: %s", read_model.name, exc)


def _recreate_read_models(db: Database, spec: ConsumerSpec) -> None:
    """Drop and create the tenant's own copies of the consumer's tables (no other's)."""
    with db.transaction() as conn:
        for read_model in reversed(db.read_models.tables(spec.options.tables)):
            read_model.drop(conn, checkfirst=True)
    create_read_models(db, spec)


def tenant_fingerprint(
    db: Database, spec: ConsumerSpec, registry: MessageRegistry = default_registry
) -> str:
    """The declaration's fingerprint in ``db``'s tenant: over the DDL of the tenant's
    physical tables, so a tenant whose tables were renamed rebuilds into them once."""
    return spec.fingerprint(registry, tables=db.read_models.tables(spec.options.tables))


def declare(
    db: Database,
    spec: ConsumerSpec,
    distribution: Distribution,
    instance_id: str,
    instance_name: str,
) -> Declared:
    """Record ``spec`` for this instance (already registered as ``instance_id``, logged
    as ``instance_name``): create it, accept it unchanged, rebuild it under a new
    declaration, or report it stale."""
    create_read_models(db, spec)
    with db.transaction() as conn:
        declared, rebuild = _record(db, conn, spec, distribution, instance_id, instance_name)
        bump_generation(db, conn)  # a new consumer, declaration or distribution: plan again
    if rebuild:
        _finish_rebuild(db, spec)
    return declared


def _finish_rebuild(db: Database, spec: ConsumerSpec) -> None:
    """Recreate the read models and let the consumer run again (its partitions were reset),
    recording the head position it replays up to as its ``rebuild_target``."""
    _recreate_read_models(db, spec)
    table = db.schema.consumers
    with db.transaction() as conn:
        target = MessageStore(db).head(conn)
        conn.execute(
            update(table)
            .where(table.c.tenant == db.tenant, table.c.name == spec.name)
            .values(state=ConsumerState.RUNNING, rebuild_target=target, updated_at=db.clock.now())
        )
        bump_generation(db, conn)  # running again: the others may claim their share
    lifecycle_event(
        "rebuilt", consumer=spec.name, position=target, reason="replaying from the start"
    )


def perform_requested_rebuild(
    db: Database, spec: ConsumerSpec, instance_id: str, stale_timeout: float, *, instance_name: str
) -> bool:
    """Rebuild ``spec`` if an operator asked for it (or a rebuild was left unfinished for
    longer than ``stale_timeout``), unless another instance got there first. The winner of
    a compare-and-set on the consumer's state does it, under new epochs of its own.

    A rebuild this instance took but left unfinished (the acknowledgement of that commit
    was lost, or the recreation of the read models failed) is finished at once: the
    consumer is REBUILDING with every partition reset to this instance."""
    table = db.schema.consumers
    with db.transaction() as conn:
        won = conn.execute(
            update(table)
            .where(
                table.c.tenant == db.tenant,
                table.c.name == spec.name,
                or_(
                    table.c.state == ConsumerState.REBUILD_REQUESTED,
                    and_(
                        table.c.state == ConsumerState.REBUILDING,
                        table.c.updated_at < db.clock.now() - stale_timeout,
                    ),
                ),
            )
            .values(state=ConsumerState.REBUILDING, updated_at=db.clock.now())
        ).rowcount
        if won != 1 and not _taken_by(db, conn, spec.name, instance_id):
            return False
        Ownership(db).reset(conn, spec.name, spec.partitions, owner=instance_id)
        bump_generation(db, conn)
    lifecycle_event(
        "rebuild",
        consumer=spec.name,
        instance=instance_name,
        instance_id=instance_id,
        reason="requested",
    )
    _finish_rebuild(db, spec)
    return True


def _taken_by(db: Database, conn: Connection, consumer: str, instance_id: str) -> bool:
    """Whether ``instance_id`` took the rebuild of ``consumer`` (REBUILDING, every partition
    reset to it: nobody claims a partition of a consumer that is not running)."""
    table = db.schema.consumers
    state = conn.execute(
        select(table.c.state).where(table.c.tenant == db.tenant, table.c.name == consumer)
    ).scalar_one_or_none()
    owners = {r.owner for r in Ownership(db).partitions(conn, [consumer])}
    return state == ConsumerState.REBUILDING and owners == {instance_id}


def _record(
    db: Database,
    conn: Connection,
    spec: ConsumerSpec,
    distribution: Distribution,
    instance_id: str,
    instance_name: str,
) -> tuple[Declared, bool]:
    table = db.schema.consumers
    ownership = Ownership(db)
    fingerprint = tenant_fingerprint(db, spec)
    where = (table.c.tenant == db.tenant, table.c.name == spec.name)
    values = {
        "kind": spec.kind.value,
        "distribution": distribution.value,
        "partitions": spec.partitions,
        "topics": json.dumps(sorted(spec.topics)),
        "types": json.dumps(spec.type_names()),
        "fingerprint": fingerprint,
        "state": ConsumerState.RUNNING,
        "updated_at": db.clock.now(),
    }
    current = select(
        table.c.fingerprint,
        table.c.previous_fingerprint,
        table.c.retired_fingerprints,
        table.c.state,
        table.c.partitions,
    ).where(*where)
    row = conn.execute(current.with_for_update()).first()

    def outcome(found: DeclarationOutcome, event: str = "", **fields: Any) -> Declared:
        """The declaration ``found``; a WARNING lifecycle ``event`` with ``fields`` if named."""
        if event:
            lifecycle_event(
                event,
                level=logging.WARNING,
                consumer=spec.name,
                instance=instance_name,
                instance_id=instance_id,
                declaration=fingerprint,
                **fields,
            )
        return Declared(consumer=spec.name, outcome=found, fingerprint=fingerprint)

    if row is None:
        try:
            with conn.begin_nested():
                conn.execute(insert(table).values(tenant=db.tenant, name=spec.name, **values))
        except IntegrityError:  # another instance declared it first: use its row
            row = conn.execute(current.with_for_update()).one()
        else:
            ownership.ensure_partitions(conn, spec.name, spec.partitions)
            return outcome(DeclarationOutcome.CREATED), False
    if row.fingerprint == fingerprint and row.state != ConsumerState.REBUILDING:
        conn.execute(update(table).where(*where).values(distribution=distribution.value))
        ownership.ensure_partitions(conn, spec.name, spec.partitions)
        return outcome(DeclarationOutcome.UNCHANGED), False
    retired: list[str] = json.loads(row.retired_fingerprints or "[]")
    rolling_back = fingerprint in retired and row.fingerprint != fingerprint
    if rolling_back and row.state != ConsumerState.REBUILD_REQUESTED:
        which = (
            "the previous declaration"
            if row.previous_fingerprint == fingerprint
            else "a declaration older than the previous one"
        )
        return outcome(
            DeclarationOutcome.STALE,
            "declaration-mismatch",
            current=row.fingerprint,
            reason=f"this instance runs {which}; applying nothing until restarted",
        ), False
    previous = row.previous_fingerprint if row.fingerprint == fingerprint else row.fingerprint
    if row.fingerprint != fingerprint:
        retired = [f for f in retired if f != fingerprint] + [row.fingerprint]
    if not spec.kind.rebuildable:
        # A kind that acts beyond its own tables would send and do everything again if
        # replayed, so a new declaration goes on where the old one stopped.
        if row.partitions != spec.partitions:
            raise RegistrationError(
                f"consumer {spec.name!r} ({spec.kind.value}) runs with {row.partitions} "
                f"partitions; it cannot change to {spec.partitions} without replaying or "
                "skipping messages (its checkpoints are per partition): keep the count, or "
                "let it finish its work and use a new name"
            )
        conn.execute(
            update(table)
            .where(*where)
            .values(
                **values, previous_fingerprint=previous, retired_fingerprints=json.dumps(retired)
            )
        )
        ownership.ensure_partitions(conn, spec.name, spec.partitions)
        return outcome(
            DeclarationOutcome.REDECLARED,
            "redeclared",
            previous=row.fingerprint,
            reason=f"new declaration; checkpoints kept ({spec.kind.article} is never rebuilt)",
        ), False
    conn.execute(
        update(table)
        .where(*where)
        .values(
            **{**values, "state": ConsumerState.REBUILDING},
            previous_fingerprint=previous,
            retired_fingerprints=json.dumps(retired),
        )
    )
    ownership.reset(conn, spec.name, spec.partitions, owner=instance_id)
    return outcome(
        DeclarationOutcome.REBUILT,
        "rebuild",
        previous=row.fingerprint,
        reason="rolling back: rebuild requested" if rolling_back else "new declaration",
    ), True


def current_declarations(
    db: Database, conn: Connection, names: list[str]
) -> dict[str, tuple[str, str]]:
    """(fingerprint, state) the database holds for each of ``names`` (absent ones omitted)."""
    table = db.schema.consumers
    rows = conn.execute(
        select(table.c.name, table.c.fingerprint, table.c.state).where(
            table.c.tenant == db.tenant, table.c.name.in_(names)
        )
    )
    return {name: (fingerprint, state) for name, fingerprint, state in rows}
