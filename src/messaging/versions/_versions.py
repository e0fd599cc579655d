"""Versions of a projection's read models: a rebuild builds a new version beside the live one.

The live version of projection ``name`` is applied as the consumer ``name`` on the
declared tables; its row in ``consumers`` records its number (``version``, NULL for 1).
A rebuild, requested by an operator or caused by a changed declaration, starts version
N as the consumer ``name@N``: a ``consumers`` row of its own holding its declaration,
partitions from checkpoint 0, and tables named ``_vN__<table>``
(:func:`~messaging.store._tenancy.physical_name`). Every instance that runs its
declaration claims its partitions like any consumer's (same assignor, claims and fence),
writes its tables through a sibling engine (:meth:`Database.for_version`) and sends
nothing the live version sends (:mod:`messaging.versions._gate`). Once it has caught up,
it takes the live version's place in one commit (:mod:`messaging.versions._cutover`);
the version it replaced stays as ``name@L`` (state ``retired``) with its tables.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Connection,
    Select,
    Table,
    bindparam,
    insert,
    inspect,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import OperationalError, ProgrammingError

from messaging._consumers import ConsumerSpec
from messaging._lifecycle import lifecycle_event
from messaging._settings import Distribution
from messaging._states import ConsumerState
from messaging.distribution._ownership import Ownership
from messaging.store import _fastpath
from messaging.store._built import per_table
from messaging.store._database import Database
from messaging.store._ddl import drop_tables_if_exist
from messaging.store._tenancy import ReadModels

log = logging.getLogger("messaging.runtime.versions")

MARK = "@"
"""Between a projection's name and a version's number in the consumer name of a version
that is not live (consumer names cannot hold it)."""


def unit_name(name: str, version: int) -> str:
    """The consumer name under which version ``version`` of ``name`` is built or kept."""
    return f"{name}{MARK}{version}"


def split_unit(unit: str) -> tuple[str, int | None]:
    """(projection name, version) of a version's consumer name; (``unit``, None) for a
    consumer name that is not one (a live version, or any other consumer)."""
    name, mark, number = unit.rpartition(MARK)
    return (name, int(number)) if mark and number.isdigit() else (unit, None)


@attrs.frozen(kw_only=True)
class UnitRow:
    """A ``consumers`` row of a projection's live version or of another of its versions."""

    unit: str
    name: str
    version: int
    fingerprint: str
    state: str
    partitions: int
    topics: tuple[str, ...]
    types: tuple[str, ...]
    cutover: dict[str, Any] | None
    """On the live row while a version takes over: what the live version had applied. On
    another version's row: its ``tables``, when its build started (``started_at``,
    seconds), once a cutover retired it ``retired_by`` (the number of the version that
    replaced it) and ``retired_at``, and once dropped ``dropped``: the row stays, without
    partitions or tables, so that no number is given twice."""

    @property
    def tables(self) -> tuple[str, ...]:
        """The physical tables of a version that is not live (as recorded in its row)."""
        return tuple(self.cutover.get("tables", ())) if self.cutover and not self.live else ()

    @property
    def dropped(self) -> bool:
        """A retired version whose partitions and tables were dropped."""
        return bool(not self.live and self.cutover and self.cutover.get("dropped"))

    @property
    def retired_by(self) -> int | None:
        """The version whose cutover retired this one; None if it never was live, or it
        was dropped."""
        if self.live or self.state != ConsumerState.RETIRED or not self.cutover or self.dropped:
            return None
        number = self.cutover.get("retired_by")
        return int(number) if number is not None else None

    @property
    def kept(self) -> bool:
        """A retired version whose tables are kept (not dropped)."""
        return self.state == ConsumerState.RETIRED and not self.live and not self.dropped

    @property
    def live(self) -> bool:
        return self.unit == self.name

    @property
    def building(self) -> bool:
        """A version being built (not the live one, not retired)."""
        return not self.live and self.state == ConsumerState.RUNNING


def unit_rows(db: Database, conn: Connection, names: Iterable[str]) -> list[UnitRow]:
    """The rows of consumers ``names`` and of their versions, live ones first."""
    names = sorted(set(names))
    if not names:
        return []
    query = _units_query(db.schema.consumers, tuple(names))
    rows = _fastpath.fetch(conn, query, {"t": db.tenant}, direct=_fastpath.sends_directly(conn))
    found = []
    for unit, fingerprint, state, partitions, topics, types, live_version, cutover in rows:
        name, version = split_unit(unit)
        if name not in names:
            continue
        found.append(
            UnitRow(
                unit=unit,
                name=name,
                version=version if version is not None else int(live_version or 1),
                fingerprint=fingerprint,
                state=state,
                partitions=int(partitions),
                topics=tuple(json.loads(topics)),
                types=tuple(json.loads(types)),
                cutover=json.loads(cutover) if cutover else None,
            )
        )
    return sorted(found, key=lambda u: (u.name, not u.live, u.version))


@per_table
def _units_query(t: Table, names: tuple[str, ...]) -> Select[Any]:
    """The query of :func:`unit_rows` for ``names`` on the table ``t``, built once (the tenant
    is its parameter ``t``)."""
    return select(
        t.c.name,
        t.c.fingerprint,
        t.c.state,
        t.c.partitions,
        t.c.topics,
        t.c.types,
        t.c.version,
        t.c.cutover,
    ).where(
        t.c.tenant == bindparam("t"),
        or_(
            t.c.name.in_([literal(n) for n in names]),  # plain binds: no expanding IN
            *(t.c.name.startswith(f"{n}{MARK}", autoescape=True) for n in names),
        ),
    )


def cutting_over(db: Database, conn: Connection, names: Iterable[str]) -> set[str]:
    """Those of projections ``names`` whose live version stopped for a cutover."""
    return {r.unit for r in unit_rows(db, conn, names) if r.state == ConsumerState.CUTTING_OVER}


def versions_changing(db: Database, names: Iterable[str]) -> bool:
    """Whether a version of any of projections ``names`` is being built or taking over."""
    with db.read() as conn:
        rows = unit_rows(db, conn, names)
    return any(r.building or r.state == ConsumerState.CUTTING_OVER for r in rows)


def start_version(
    db: Database,
    conn: Connection,
    spec: ConsumerSpec,
    fingerprint: str,
    distribution: Distribution,
    *,
    types: Sequence[str],
    reason: str,
) -> str:
    """Record a new version of ``spec`` under ``fingerprint`` (in ``conn``'s transaction;
    each instance building it makes its tables, :func:`create_version_tables`); return its
    consumer name. Its number is the next one whose tables do not exist (a number is never
    given twice: a dropped version's row stays; tables may outlive rows). A version still
    being built under another declaration is retired first: only the newest declaration
    is built."""
    rows = unit_rows(db, conn, [spec.name])
    version = max([1, *(r.version for r in rows)]) + 1
    present = set(inspect(conn).get_table_names())
    while any(
        t.name in present for t in ReadModels(db.tenant, version).tables(spec.options.tables)
    ):
        version += 1
    t = db.schema.consumers
    for row in rows:
        if row.building:
            conn.execute(
                update(t)
                .where(t.c.tenant == db.tenant, t.c.name == row.unit)
                .values(state=ConsumerState.RETIRED, updated_at=db.clock.now())
            )
            Ownership(db).fence_all(conn, row.unit)
    unit = unit_name(spec.name, version)
    tables = [table.name for table in ReadModels(db.tenant, version).tables(spec.options.tables)]
    conn.execute(
        insert(t).values(
            tenant=db.tenant,
            name=unit,
            kind=spec.kind.value,
            distribution=distribution.value,
            partitions=spec.partitions,
            topics=json.dumps(sorted(spec.topics)),
            types=json.dumps(list(types)),
            fingerprint=fingerprint,
            state=ConsumerState.RUNNING,
            updated_at=db.clock.now(),
            cutover=json.dumps({"tables": tables, "started_at": seconds_now(db, conn)}),
        )
    )
    Ownership(db).ensure_partitions(conn, unit, spec.partitions)
    lifecycle_event("version", consumer=spec.name, version=version, reason=reason)
    return unit


def seconds_now(db: Database, conn: Connection) -> float:
    """The database clock's time, in seconds (recorded in a version's row)."""
    return float(conn.execute(select(db.clock.now())).scalar_one())


def create_version_tables(db: Database, spec: ConsumerSpec, unit: str, version: int) -> bool:
    """Create the tables of version ``version`` of ``spec`` (the consumer ``unit``) that do
    not exist yet, while it is being built; whether it still is. Its tables are made only
    then: an instance whose round read the version as building when another instance's
    swap had just renamed its tables (or a newer rebuild had replaced it) would otherwise
    make empty ones under names a later swap needs. On SQLite the check and the creation
    are one transaction; on MySQL/MariaDB (DDL commits) a table this call created is
    dropped again if the version is found not building after it."""
    tables = ReadModels(db.tenant, version).tables(spec.options.tables)
    if db.is_sqlite:
        with db.transaction() as conn:
            if not still_building(db, conn, unit, version):
                return False
            for table in tables:
                table.create(conn, checkfirst=True)
        return True
    with db.read() as conn:
        if not still_building(db, conn, unit, version):
            return False
    created = create_tables(db, tables)
    with db.read() as conn:
        building = still_building(db, conn, unit, version)
    if created and not building:
        drop_tables_if_exist(db, created)
    return building


def still_building(db: Database, conn: Connection, unit: str, version: int) -> bool:
    """Whether version ``version`` (the consumer ``unit``) is being built and its swap has
    not begun (once begun, its tables may be renamed at any moment)."""
    t = db.schema.consumers
    name, _ = split_unit(unit)
    rows = {
        r.name: r
        for r in conn.execute(
            select(t.c.name, t.c.state, t.c.cutover).where(
                t.c.tenant == db.tenant, t.c.name.in_([unit, name])
            )
        )
    }
    row, live = rows.get(unit), rows.get(name)
    if row is None or row.state != ConsumerState.RUNNING:
        return False
    cutover = json.loads(live.cutover) if live is not None and live.cutover else {}
    return not (cutover.get("version") == version and cutover.get("swapping"))


def create_tables(db: Database, tables: Iterable[Table]) -> list[str]:
    """Create those of ``tables`` that do not exist yet, each in its own transaction (DDL
    commits implicitly on MySQL); return the names of those this call created (a
    concurrent creation by another instance is no error, and not counted)."""
    created = []
    for table in tables:
        try:
            with db.transaction() as conn:
                if inspect(conn).has_table(table.name):
                    continue
                table.create(conn)
            created.append(table.name)
        except (OperationalError, ProgrammingError) as exc:
            with db.read() as conn:
                if not inspect(conn).has_table(table.name):
                    raise
            log.debug("read model %s created concurrently: %s", table.name, exc)
    return created
