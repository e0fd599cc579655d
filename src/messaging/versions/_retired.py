"""Retired versions of a projection: kept for a rollback, dropped beyond the retention.

A dropped version loses its partition rows and tables; its ``consumers`` row stays,
marked ``dropped``, so that its number is never given again.

A cutover leaves the version it replaced as ``name@L`` (state ``retired``) with its
tables ``_vL__<table>`` as they were at that moment, and its checkpoints: a rollback
(:func:`revive`) builds it again from there, so it catches up only the messages since,
and takes over like any new version. After each cutover the versions beyond the
``retired-versions`` most recently retired are dropped (rows, then tables), and so are
versions replaced while being built (never live, nothing to go back to).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Connection, delete, inspect, select, update

from messaging._errors import OperationError
from messaging._lifecycle import lifecycle_event
from messaging._states import ConsumerState
from messaging.distribution._ownership import Ownership
from messaging.distribution._pulse import bump_generation
from messaging.store._database import Database
from messaging.store._ddl import drop_tables_if_exist
from messaging.versions._versions import UnitRow, seconds_now, unit_rows


class NoRetiredVersion(OperationError):
    """A rollback refused: the live version replaced none, or the one it replaced was
    dropped."""


def droppable(rows: Sequence[UnitRow], keep: int) -> list[UnitRow]:
    """Of the versions ``rows``, the retired ones to drop: those replaced while being
    built, and those a cutover retired beyond the ``keep`` latest."""
    retired = [r for r in rows if r.kept]
    by_cutover = sorted(
        (r for r in retired if r.retired_by is not None),
        key=lambda r: float((r.cutover or {}).get("retired_at", 0)),
        reverse=True,
    )
    return [r for r in retired if r.retired_by is None] + by_cutover[keep:]


def drop_versions(db: Database, units: Sequence[UnitRow]) -> list[UnitRow]:
    """Mark those of ``units`` still retired dropped (one transaction), then drop their
    tables; return the versions dropped. Tables left by a crash in between are
    dropped by :func:`drop_retired` later, or by ``projections drop-version``."""
    with db.transaction() as conn:
        dropped = [unit for unit in units if delete_version_rows(db, conn, unit)]
    drop_tables_if_exist(db, [name for unit in dropped for name in unit.tables])
    return dropped


def delete_version_rows(db: Database, conn: Connection, unit: UnitRow) -> bool:
    """Delete the partition rows of retired version ``unit`` and mark its row dropped
    (kept, so that its number is never given again), unless a rollback revived it since;
    whether it was dropped."""
    c, p = db.schema.consumers, db.schema.partitions
    marked = json.dumps({**(unit.cutover or {}), "dropped": True})
    gone = conn.execute(
        update(c)
        .where(
            c.c.tenant == db.tenant,
            c.c.name == unit.unit,
            c.c.state == ConsumerState.RETIRED,
        )
        .values(cutover=marked, updated_at=db.clock.now())
    ).rowcount
    if gone:
        conn.execute(delete(p).where(p.c.tenant == db.tenant, p.c.consumer == unit.unit))
    return bool(gone)


def drop_retired(db: Database, name: str, keep: int) -> None:
    """Drop the retired versions of projection ``name`` beyond the ``keep`` latest."""
    with db.read() as conn:
        rows = unit_rows(db, conn, [name])
    dropped = drop_versions(db, droppable(rows, keep))
    if dropped:
        lifecycle_event(
            "versions-dropped",
            consumer=name,
            versions=[u.version for u in dropped],
            reason=f"retention: the {keep} latest retired versions are kept",
        )


def revive(db: Database, conn: Connection, name: str) -> UnitRow:
    """Build again, from its checkpoints, the version the live version of ``name``
    replaced (in ``conn``'s transaction); OperationError if there is none to go back to.
    The instances running its declaration build it; it takes over like a new version."""
    rows = unit_rows(db, conn, [name])
    live = next((r for r in rows if r.live), None)
    if live is None:
        raise OperationError(f"unknown projection {name!r}")
    previous = next((r for r in rows if r.retired_by == live.version), None)
    if previous is None:
        raise NoRetiredVersion(
            f"{name!r} has no retired version to roll back to: version {live.version} is live "
            "and the version it replaced was dropped (or it replaced none)"
        )
    present = {t.lower() for t in inspect(conn).get_table_names()}
    missing = [t for t in previous.tables if t.lower() not in present]
    if missing:
        raise OperationError(
            f"version {previous.version} of {name!r} cannot be rolled back to: its tables "
            f"{', '.join(missing)} are gone"
        )
    c = db.schema.consumers
    conn.execute(
        update(c)
        .where(c.c.tenant == db.tenant, c.c.name == previous.unit)
        .values(
            state=ConsumerState.RUNNING,
            cutover=json.dumps(
                {"tables": list(previous.tables), "started_at": seconds_now(db, conn)}
            ),
            updated_at=db.clock.now(),
        )
    )
    retired_list = conn.execute(
        select(c.c.retired_fingerprints).where(c.c.tenant == db.tenant, c.c.name == name)
    ).scalar_one_or_none()
    kept = [f for f in json.loads(retired_list or "[]") if f != previous.fingerprint]
    conn.execute(
        update(c)
        .where(c.c.tenant == db.tenant, c.c.name == name)
        .values(retired_fingerprints=json.dumps(kept))
    )
    Ownership(db).fence_all(conn, previous.unit)
    bump_generation(db, conn)
    return previous
