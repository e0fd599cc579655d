"""Consumer declarations in the database: the ``consumers`` table and read-model tables.

A consumer's fingerprint covers its version, topics, handled types, partition count
and read-model schema. When an instance starts with a declaration of a projection the
database has not seen, it starts a new version of the projection under that declaration
(:mod:`messaging.versions._versions`): built beside the live one, which goes on being
applied and read until the new one takes its place (:mod:`messaging.versions._cutover`).
An instance whose declaration is that of a version being built joins its build. An
instance that starts with a declaration the projection has left behind (one a cutover
retired) applies nothing and says which, unless an operator requested a rebuild: then
it builds a version under its declaration (a roll back). Kinds that act beyond their
own tables (route consumers, sagas) are never rebuilt: a new declaration goes on from
their checkpoints.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import attrs
from sqlalchemy import Connection, Row, insert, select, update
from sqlalchemy.exc import IntegrityError

from messaging._consumers import ConsumerSpec
from messaging._errors import RegistrationError
from messaging._lifecycle import lifecycle_event
from messaging._messages import MessageRegistry
from messaging._messages import registry as default_registry
from messaging._settings import Distribution
from messaging._states import ConsumerState, DeclarationOutcome
from messaging.distribution._ownership import Ownership
from messaging.distribution._pulse import bump_generation
from messaging.store._database import Database
from messaging.store._table_registry import register
from messaging.versions._versions import (
    create_tables,
    split_unit,
    start_version,
    unit_rows,
)

log = logging.getLogger("messaging.runtime.declarations")


@attrs.define(frozen=True, kw_only=True)
class Declared:
    """What :func:`declare` found: the consumer is new, unchanged, rebuilt, or stale here."""

    consumer: str
    outcome: DeclarationOutcome
    fingerprint: str
    unit: str
    """The consumer this instance applies: the live version, or a version being built."""


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
    create_tables(db, tables)


def tenant_fingerprint(
    db: Database, spec: ConsumerSpec, registry: MessageRegistry = default_registry
) -> str:
    """The declaration's fingerprint in ``db``'s tenant: over the DDL of the tenant's
    physical tables, so a tenant whose tables were renamed rebuilds into them once."""
    return spec.fingerprint(registry, tables=db.read_models.tables(spec.options.tables))


def declared_elsewhere(db: Database, running: Iterable[str]) -> list[str]:
    """The consumers declared in this tenant (by any code, now or before) that are not
    among ``running``, sorted: what an instance says at start it does not run."""
    c = db.schema.consumers
    with db.read() as conn:
        names = conn.execute(select(c.c.name).where(c.c.tenant == db.tenant)).scalars().all()
    mine = set(running)
    return sorted({n for n in names if split_unit(n)[1] is None and n not in mine})


def declare(
    db: Database,
    spec: ConsumerSpec,
    distribution: Distribution,
    instance_id: str,
    instance_name: str,
) -> Declared:
    """Record ``spec`` for this instance (already registered as ``instance_id``, logged
    as ``instance_name``): create it, accept it unchanged, build a new version of it (or
    join that build), or report it stale."""
    create_read_models(db, spec)
    with db.transaction() as conn:
        declared = _Record(db, conn, spec, distribution, instance_id, instance_name).declare()
        bump_generation(db, conn)  # a new consumer, declaration or distribution: plan again
    return declared


def start_requested_rebuild(
    db: Database, spec: ConsumerSpec, fingerprint: str, distribution: Distribution
) -> bool:
    """Start a new version of ``spec`` if an operator asked for a rebuild (or an older
    release left it rebuilding in place), unless another instance got there first: the
    winner of a compare-and-set on the consumer's state, which the live version keeps."""
    table = db.schema.consumers
    with db.transaction() as conn:
        won = conn.execute(
            update(table)
            .where(
                table.c.tenant == db.tenant,
                table.c.name == spec.name,
                table.c.fingerprint == fingerprint,
                table.c.state.in_([ConsumerState.REBUILD_REQUESTED, ConsumerState.REBUILDING]),
            )
            .values(state=ConsumerState.RUNNING, updated_at=db.clock.now())
        ).rowcount
        if won != 1:
            return False
        start_version(
            db,
            conn,
            spec,
            fingerprint,
            distribution,
            types=spec.stored_type_names(),
            reason="requested",
        )
        bump_generation(db, conn)
    return True


_Row = Row[Any, Any, Any, Any, Any]
"""A consumer's row as :meth:`_Record._row` reads it: fingerprint, previous fingerprint,
retired fingerprints, state, partitions."""


class _Record:
    """One declaration of ``spec`` recorded in ``conn``'s transaction: its consumer's row
    created, kept, taken up by a build already under way, refused as stale, replaced (a
    kind that is never rebuilt) or answered by a new version to build."""

    def __init__(
        self,
        db: Database,
        conn: Connection,
        spec: ConsumerSpec,
        distribution: Distribution,
        instance_id: str,
        instance_name: str,
    ) -> None:
        self.db, self.conn, self.spec = db, conn, spec
        self.instance_id, self.instance_name = instance_id, instance_name
        self.table = table = db.schema.consumers
        self.ownership = Ownership(db)
        self.fingerprint = tenant_fingerprint(db, spec)
        self.where = (table.c.tenant == db.tenant, table.c.name == spec.name)
        self.values: dict[str, Any] = {
            "kind": spec.kind.value,
            "distribution": distribution.value,
            "partitions": spec.partitions,
            "topics": json.dumps(sorted(spec.topics)),
            "types": json.dumps(spec.stored_type_names()),
            "fingerprint": self.fingerprint,
            "state": ConsumerState.RUNNING,
            "updated_at": db.clock.now(),
        }
        if not spec.kind.rebuildable:  # never rebuilt: its version is the one in its code
            self.values["version"] = spec.options.version
        self.distribution = distribution

    def declare(self) -> Declared:
        """Record the declaration; what came of it."""
        row = self._row()
        if row is None:
            return self._create()
        if row.fingerprint == self.fingerprint:
            return self._unchanged()
        if self.spec.kind.rebuildable:
            joined = self._building_unit()
            if joined is not None:
                return self._outcome(DeclarationOutcome.BUILDING, unit=joined)
        retired: list[str] = json.loads(row.retired_fingerprints or "[]")
        rolling_back = self.fingerprint in retired
        if rolling_back and row.state != ConsumerState.REBUILD_REQUESTED:
            return self._stale(row)
        if not self.spec.kind.rebuildable:
            return self._redeclare(row, retired)
        return self._build(row, rolling_back)

    def _row(self) -> _Row | None:
        t = self.table
        current = select(
            t.c.fingerprint,
            t.c.previous_fingerprint,
            t.c.retired_fingerprints,
            t.c.state,
            t.c.partitions,
        ).where(*self.where)
        return self.conn.execute(current.with_for_update()).first()

    def _create(self) -> Declared:
        """The first declaration of the name (another instance may insert it first)."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(
                    insert(self.table).values(
                        tenant=self.db.tenant, name=self.spec.name, **self.values
                    )
                )
        except IntegrityError:  # another instance declared it first: use its row
            return self.declare()
        self.ownership.ensure_partitions(self.conn, self.spec.name, self.spec.partitions)
        return self._outcome(DeclarationOutcome.CREATED)

    def _unchanged(self) -> Declared:
        kept = {k: self.values[k] for k in ("distribution", "version") if k in self.values}
        self.conn.execute(update(self.table).where(*self.where).values(**kept))
        self.ownership.ensure_partitions(self.conn, self.spec.name, self.spec.partitions)
        return self._outcome(DeclarationOutcome.UNCHANGED)

    def _building_unit(self) -> str | None:
        """The unit of a build of this very declaration under way, which it joins."""
        for unit in unit_rows(self.db, self.conn, [self.spec.name]):
            if unit.building and unit.fingerprint == self.fingerprint:
                return unit.unit
        return None

    def _stale(self, row: _Row) -> Declared:
        """A retired declaration with no rollback asked for: this instance runs old code."""
        which = (
            "the previous declaration"
            if row.previous_fingerprint == self.fingerprint
            else "a declaration older than the previous one"
        )
        return self._outcome(
            DeclarationOutcome.STALE,
            "declaration-mismatch",
            current=row.fingerprint,
            reason=f"this instance runs {which}; applying nothing until restarted with the "
            f"live one, or until `projections rollback {self.spec.name}` (or `rebuild`) makes "
            "this one live: to roll back, or forward again after a rollback",
        )

    def _redeclare(self, row: _Row, retired: list[str]) -> Declared:
        """A new declaration of a kind that acts beyond its own tables: replayed, it would
        send and do everything again, so it goes on where the old one stopped."""
        spec = self.spec
        if row.partitions != spec.partitions:
            raise RegistrationError(
                f"consumer {spec.name!r} ({spec.kind.value}) runs with {row.partitions} "
                f"partitions; it cannot change to {spec.partitions} without replaying or "
                "skipping messages (its checkpoints are per partition): keep the count, or "
                "let it finish its work and use a new name"
            )
        retired = [f for f in retired if f != self.fingerprint] + [row.fingerprint]
        self.conn.execute(
            update(self.table)
            .where(*self.where)
            .values(
                **self.values,
                previous_fingerprint=row.fingerprint,
                retired_fingerprints=json.dumps(retired),
            )
        )
        self.ownership.ensure_partitions(self.conn, spec.name, spec.partitions)
        return self._outcome(
            DeclarationOutcome.REDECLARED,
            "redeclared",
            previous=row.fingerprint,
            reason=f"new declaration; checkpoints kept ({spec.kind.article} is never rebuilt)",
        )

    def _build(self, row: _Row, rolling_back: bool) -> Declared:
        """A new version to build beside the live one (a rollback's, if one was asked)."""
        if rolling_back:  # the request is taken by this declaration's version
            self.conn.execute(
                update(self.table).where(*self.where).values(state=ConsumerState.RUNNING)
            )
        reason = "rolling back: rebuild requested" if rolling_back else "new declaration"
        unit = start_version(
            self.db,
            self.conn,
            self.spec,
            self.fingerprint,
            self.distribution,
            types=self.spec.stored_type_names(),
            reason=reason,
        )
        return self._outcome(
            DeclarationOutcome.BUILDING, "build", unit=unit, previous=row.fingerprint, reason=reason
        )

    def _outcome(
        self, found: DeclarationOutcome, event: str = "", *, unit: str | None = None, **fields: Any
    ) -> Declared:
        """The declaration ``found`` (of ``unit``: the consumer's own name unless a version
        is built); a WARNING lifecycle ``event`` with ``fields`` if named."""
        if event:
            lifecycle_event(
                event,
                level=logging.WARNING,
                consumer=self.spec.name,
                instance=self.instance_name,
                instance_id=self.instance_id,
                declaration=self.fingerprint,
                **fields,
            )
        return Declared(
            consumer=self.spec.name,
            outcome=found,
            fingerprint=self.fingerprint,
            unit=unit or self.spec.name,
        )
