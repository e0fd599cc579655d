"""Operator commands on a projection's versions: list them, roll back to the one the live
version replaced, drop a retired one. Audited and applied once like every operator
command (:mod:`projections._operations`)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, inspect, select

from messaging import ConsumerSettings, Database, OperationError
from messaging.operations import (
    ConsumerState,
    Membership,
    UnitRow,
    delete_version_rows,
    drop_tables_if_exist,
    revive,
    split_unit,
    unit_rows,
)
from projections._kinds import PROJECTION
from projections._operations import _audit, _kind, _once, _state, check_reason
from projections._reports import consumers_report


def _role(row: UnitRow) -> str:
    if row.live:
        return "live"
    return "building" if row.building else "retired"


def _projection(
    db: Database, conn: Connection, consumer: str, *, lock: bool = True, any_kind: bool = False
) -> tuple[str, list[UnitRow]]:
    """The live state (its row locked first, unless not ``lock``) and the version rows of
    projection ``consumer``, live first; OperationError for a version's name, an unknown
    consumer or (unless ``any_kind``: a saga or route consumer has its declared version
    alone) one of another kind."""
    name, version = split_unit(consumer)
    if version is not None:
        raise OperationError(f"{consumer!r} is version {version} of {name!r}: name {name!r}")
    state = _state(db, conn, consumer) if lock else ""
    rows = unit_rows(db, conn, [consumer])
    if not any(r.live for r in rows):
        raise OperationError(f"unknown projection {consumer!r}")
    kind = _kind(db, conn, consumer)
    if kind != PROJECTION.value and not any_kind:
        raise OperationError(f"consumer {consumer!r} is a {kind}: only projections have versions")
    return state, rows


def versions_report(db: Database, settings: ConsumerSettings, consumer: str) -> dict[str, Any]:
    """``{"projection", "versions": [...]}``: each version of projection ``consumer``, live
    first: ``name``, ``version``, ``role`` (live, building, retired), ``state``,
    ``declaration`` (its fingerprint), ``tables`` (those that exist); a building one's
    ``build`` (applied, total, rate per second since it started, ``eta_seconds``, its
    ``halted`` partitions, and its ``builders``: the live instances running it, none while
    no instance runs its declaration); a retired one's ``retired_by`` and ``retired_at``.
    A consumer of a kind that is never rebuilt (a saga, a route consumer) has one: the
    version its running code declares."""
    with db.read() as conn:
        _, rows = _projection(db, conn, consumer, lock=False, any_kind=True)
        members = Membership(db).instances(conn, settings.stale_instance_timeout)
        r = db.schema.read_models
        present = {t.lower() for t in inspect(conn).get_table_names()}
        live_tables = sorted(
            name
            for name in conn.execute(
                select(r.c.table_name).where(r.c.tenant == db.tenant, r.c.consumer == consumer)
            ).scalars()
            if name.lower() in present  # (a table renamed by a later version is gone)
        )
    building = [row.unit for row in rows if row.building]
    reported = {
        e["name"]: e
        for e in (consumers_report(db, settings, names=building)["consumers"] if building else [])
    }
    versions = []
    for row in (r for r in rows if not r.dropped):
        entry: dict[str, Any] = {
            "name": row.unit,
            "version": row.version,
            "role": _role(row),
            "state": row.state,
            "declaration": row.fingerprint,
            "tables": live_tables if row.live else [t for t in row.tables if t.lower() in present],
        }
        build = reported.get(row.unit, {}).get("build")
        if row.building and build is not None:
            partitions = reported[row.unit]["partitions"]
            halted = [p["partition"] for p in partitions if p["status"] == "halted"]
            builders = sorted(
                m.name for m in members if m.live and not m.stopping and row.unit in m.runs
            )
            entry["build"] = {**build, "halted": halted, "builders": builders}
        if row.retired_by is not None:
            entry["retired_by"] = row.retired_by
            entry["retired_at"] = (row.cutover or {}).get("retired_at")
        versions.append(entry)
    return {"projection": consumer, "versions": versions}


def format_versions(report: dict[str, Any]) -> str:
    """``projections versions``' table."""
    lines = [f"{'version':>7}  {'role':<9} {'state':<13} {'declaration':<14} detail"]
    for v in report["versions"]:
        detail = ", ".join(v["tables"]) or "no tables"
        if "build" in v:
            b = v["build"]
            eta = "unknown" if b["eta_seconds"] is None else f"{b['eta_seconds']:.0f} s"
            detail = f"{b['applied']}/{b['total']} applied, {b['rate']}/s, about {eta} left"
            if not b.get("builders", True):
                detail = (
                    f"{b['applied']}/{b['total']} applied; no live instance runs this "
                    "declaration: start one with it (or roll back)"
                )
            elif b.get("halted"):
                halted = ", ".join(map(str, b["halted"]))
                detail = (
                    f"{b['applied']}/{b['total']} applied, halted (partitions {halted}): "
                    f"projections resume {v['name']}"
                )
        elif "retired_by" in v:
            ago = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(v["retired_at"] or 0))
            detail = f"replaced by version {v['retired_by']} at {ago} UTC; {detail}"
        lines.append(
            f"{v['version']:>7}  {v['role']:<9} {v['state']:<13} {v['declaration'][:12]:<14} "
            f"{detail}"
        )
    return "\n".join(lines)


def rollback(db: Database, consumer: str, *, who: str, reason: str = "") -> int:
    """Make the version the live one replaced live again: it is built again from where it
    was retired (catching up only the messages since) by the instances running its
    declaration, and takes over as a new version does; returns its number."""
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> int:
        state, rows = _projection(db, conn, consumer)  # one rollback at a time
        building = [u.unit for u in rows if u.building]
        if building or state == ConsumerState.CUTTING_OVER:
            raise OperationError(
                f"a version of {consumer!r} is being built: "
                f"{', '.join(building) or 'a new version is taking over'}; roll back once "
                "it took over"
            )
        if state in (ConsumerState.REBUILD_REQUESTED, ConsumerState.REBUILDING):
            raise OperationError(f"a rebuild of {consumer!r} was requested and not started yet")
        live = next(r for r in rows if r.live)
        previous = revive(db, conn, consumer)
        detail = {"reason": reason, "to": previous.version, "from": live.version}
        _audit(db, conn, "rollback", consumer, who, detail, command_id)
        return previous.version

    return _once(db, "rollback", body, lambda detail: int(detail["to"]))


def drop_version(
    db: Database, consumer: str, version: int, *, who: str, reason: str = ""
) -> list[str]:
    """Drop retired version ``version`` of projection ``consumer``: its rows, then its
    tables (returned). The live version and one being built cannot be dropped."""
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> list[str]:
        _, rows = _projection(db, conn, consumer)
        row = next((r for r in rows if r.version == version and not r.dropped), None)
        if row is None:
            known = ", ".join(f"{r.version} ({_role(r)})" for r in rows if not r.dropped)
            raise OperationError(f"{consumer!r} has no version {version}; versions: {known}")
        if row.live or row.building:
            raise OperationError(
                f"version {version} of {consumer!r} is {_role(row)}: only a retired version "
                "can be dropped"
            )
        delete_version_rows(db, conn, row)
        tables = list(row.tables)
        detail = {"reason": reason, "version": version, "tables": tables}
        _audit(db, conn, "drop-version", consumer, who, detail, command_id)
        return tables

    tables = _once(db, "drop-version", body, lambda detail: list(detail["tables"]))
    drop_tables_if_exist(db, tables)
    return tables
