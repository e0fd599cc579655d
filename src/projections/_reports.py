"""Reports on the cluster as the database records it: consumers, partitions, instances.

A partition is OWNED while a live instance owns it, ORPHANED when its owner is no
longer live, and UNCLAIMED when nobody owns it. Lag is the number of messages of the
partition (in the consumer's topics and types) after its checkpoint. Each consumer
reports its ``version``; a version of a projection being built beside the live one is
reported as the consumer ``name@N`` (``version_of``: the projection) with its progress
under ``build`` while it runs, and a version a cutover replaced is ``retired``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, RowMapping, Select, and_, func, select
from sqlalchemy.sql.elements import ColumnElement

from messaging import ConsumerSettings, Database
from messaging.operations import (
    STALE,
    ConsumerState,
    Membership,
    OwnerState,
    describe_need,
    pending_need,
    seconds_now,
    split_unit,
    stale_of,
)

LATE_HEARTBEATS = 2
"""A live instance is late when its last heartbeat is older than this many intervals."""
IN_MEMORY = "in-memory"
"""The kind of an in-memory consumer in the reports: each instance runs its own copy."""


def pending(db: Database, consumer: RowMapping) -> ColumnElement[bool]:
    """Joins a partition row of ``consumer`` (a ``consumers`` row) to its messages after
    its checkpoint: those of the consumer's topics and types that hash to it."""
    parts, messages = db.schema.partitions, db.schema.messages
    return and_(
        messages.c.tenant == parts.c.tenant,
        messages.c.topic.in_(json.loads(consumer["topics"])),
        messages.c.type.in_(json.loads(consumer["types"])),
        messages.c.position > parts.c.checkpoint,
        messages.c.partition_hash % consumer["partitions"] == parts.c.partition_no,
    )


def _lag_query(db: Database, consumer: RowMapping, ages: bool) -> Select[Any]:
    """Per partition of ``consumer``: its lag, and with ``ages`` the seconds since its row
    changed and since its oldest message to apply was recorded (None: nothing to apply)."""
    parts, messages = db.schema.partitions, db.schema.messages
    columns: list[Any] = [parts.c.partition_no, func.count(messages.c.position).label("lag")]
    if ages:
        now = db.clock.now()
        columns += [
            (now - parts.c.updated_at).label("changed"),
            (now - func.min(messages.c.recorded_at)).label("waiting"),
        ]
    return (
        select(*columns)
        .select_from(parts.outerjoin(messages, pending(db, consumer)))
        .where(parts.c.tenant == db.tenant, parts.c.consumer == consumer["name"])
        .group_by(parts.c.partition_no, *([parts.c.updated_at] if ages else []))
    )


def _ages(row: Row[Any]) -> tuple[float, float]:
    """(idle, changed) of a row of :func:`_lag_query` with ages, in seconds, never negative."""
    changed = max(float(row.changed), 0.0)
    return (0.0 if row.waiting is None else max(min(changed, float(row.waiting)), 0.0), changed)


def consumers_report(
    db: Database,
    settings: ConsumerSettings,
    conn: Connection | None = None,
    *,
    ages: bool = False,
    names: Collection[str] | None = None,
) -> dict[str, Any]:
    """``{"consumers": [{"name", "kind", "distribution", "partitions": [...]}]}``, read in
    ``conn``'s transaction if given, else in one of its own; of the consumers ``names``
    only, if given. With ``ages`` each partition
    also has ``idle`` (seconds since it last progressed: its row changed, or its oldest
    message to apply was recorded, whichever is later; 0 with nothing to apply) and
    ``changed`` (seconds since its row last changed), read by the same query as its lag."""
    schema = db.schema
    consumers, parts = schema.consumers, schema.partitions
    with nullcontext(conn) if conn is not None else db.read() as conn:
        instances = {
            row.id: row for row in Membership(db).instances(conn, settings.stale_instance_timeout)
        }
        declared = (
            conn.execute(
                select(consumers)
                .where(
                    consumers.c.tenant == db.tenant,
                    *([] if names is None else [consumers.c.name.in_(list(names))]),
                )
                .order_by(consumers.c.name)
            )
            .mappings()
            .all()
        )
        parked_table = schema.parked
        parked: dict[tuple[str, int], tuple[int, float]] = {
            (row.consumer, row.partition_no): (int(row.sources), float(row.age))
            for row in conn.execute(
                select(
                    parked_table.c.consumer,
                    parked_table.c.partition_no,
                    func.count().label("sources"),
                    (db.clock.now() - func.min(parked_table.c.parked_at)).label("age"),
                )
                .where(parked_table.c.tenant == db.tenant)
                .group_by(parked_table.c.consumer, parked_table.c.partition_no)
            )
        }
        report = []
        for consumer in declared:
            topics, types = json.loads(consumer["topics"]), json.loads(consumer["types"])
            name, version = split_unit(consumer["name"])
            if version is not None and '"dropped"' in (consumer["cutover"] or ""):
                continue  # a dropped version: its row only keeps its number taken
            counts = conn.execute(_lag_query(db, consumer, ages)).all()
            lags: dict[int, int] = {int(row.partition_no): int(row.lag) for row in counts}
            aged = {int(row.partition_no): _ages(row) for row in counts} if ages else {}
            rows = conn.execute(
                select(parts)
                .where(parts.c.tenant == db.tenant, parts.c.consumer == consumer["name"])
                .order_by(parts.c.partition_no)
            ).mappings()
            partitions = []
            for row in rows:
                owner = instances.get(row["owner"]) if row["owner"] else None
                if row["owner"] is None:
                    state = OwnerState.UNCLAIMED
                elif owner is not None and owner.live:
                    state = OwnerState.OWNED
                else:
                    state = OwnerState.ORPHANED
                entry: dict[str, Any] = {
                    "partition": row["partition_no"],
                    "instance": owner.name if owner is not None else row["owner"],
                    "instance_id": row["owner"],
                    "state": state,
                    "status": row["status"],
                    "epoch": row["epoch"],
                    "checkpoint": row["checkpoint"],
                    "lag": int(lags.get(row["partition_no"], 0)),
                }
                if ages:  # (a partition added between the two reads: just made)
                    entry["idle"], entry["changed"] = aged.get(row["partition_no"], (0.0, 0.0))
                needs = pending_need(row["needs"], row["checkpoint"])
                if needs is not None:  # waits for an instance with a newer declaration
                    entry["waiting"] = describe_need(needs)
                if row["halted_position"] is not None:
                    entry["halted"] = {
                        "position": row["halted_position"],
                        "type": row["halted_type"],
                        "error": row["error"],
                        "trace": row["halted_trace"],
                    }
                held = parked.get((consumer["name"], row["partition_no"]))
                if held:  # how many sources, and the seconds since the oldest was parked
                    entry["parked_sources"], entry["parked_age"] = held
                partitions.append(entry)
            entry = {
                "name": consumer["name"],
                "kind": consumer["kind"],
                "distribution": consumer["distribution"],
                "state": consumer["state"],
                "version": version or consumer["version"] or 1,
                "partitions": partitions,
            }
            total_parked = sum(p.get("parked_sources", 0) for p in partitions)
            if total_parked:
                entry["parked_sources"] = total_parked
                entry["parked_age"] = max(p.get("parked_age", 0.0) for p in partitions)
            if version is not None:
                entry["version_of"] = name
                if consumer["state"] == ConsumerState.RUNNING:
                    total = _total(db, conn, topics, types)
                    applied = total - sum(lags.values())
                    started = json.loads(consumer["cutover"] or "{}").get("started_at")
                    entry["build"] = build_progress(applied, total, started, seconds_now(db, conn))
            report.append(entry)
        in_memory = _in_memory(db, conn, instances)
    return {"consumers": report, "in_memory": in_memory}


def _in_memory(db: Database, conn: Connection, instances: dict[str, Any]) -> list[dict[str, Any]]:
    """Each in-memory consumer with its copy on every instance that published one: state,
    position, lag (messages of its topics and types after the position), halted message."""
    m = db.schema.messages
    by_name: dict[str, list[dict[str, Any]]] = {}
    for instance_id, published in Membership(db).in_memory(conn).items():
        row = instances.get(instance_id)
        if row is None:
            continue
        for name, copy in sorted(published.get("consumers", {}).items()):
            lag = conn.execute(
                select(func.count()).where(
                    m.c.tenant == db.tenant,
                    m.c.topic.in_(copy["topics"]),
                    m.c.type.in_(copy["types"]),
                    m.c.position > copy["position"],
                )
            ).scalar_one()
            entry = {
                "instance": row.name,
                "instance_id": instance_id,
                "live": row.live,
                "admin": published.get("admin"),
                "state": copy["state"],
                "position": copy["position"],
                "lag": int(lag),
            }
            for held in ("halted", "waiting"):
                if held in copy:
                    entry[held] = copy[held]
            by_name.setdefault(name, []).append(entry)
    return [
        {"name": name, "kind": IN_MEMORY, "instances": copies}
        for name, copies in sorted(by_name.items())
    ]


def in_memory_copies(db: Database, settings: ConsumerSettings, name: str) -> list[dict[str, Any]]:
    """The copies of in-memory consumer ``name`` the instances published (empty when no
    instance runs one by that name)."""
    for entry in consumers_report(db, settings)["in_memory"]:
        if entry["name"] == name:
            return list(entry["instances"])
    return []


def in_memory_pointer(
    db: Database, settings: ConsumerSettings, name: str, command: str, *, skip_poison: bool
) -> str | None:
    """Why a command through the database cannot reach in-memory consumer ``name``, and
    where to send it instead: each instance's admin endpoint (None when no instance
    publishes a copy of ``name``)."""
    copies = in_memory_copies(db, settings, name)
    if not copies:
        return None
    route = f"/admin/consumers/{name}/{command}"
    where = [
        f"{c['instance']}: POST {c['admin']}{route}"
        if c["admin"]
        else f"{c['instance']}: started without --admin-port"
        for c in copies
    ]
    body = ' with {"skip_poison": true}' if skip_poison else ""
    return (
        f"{name} is an in-memory projection: each instance runs its own copy, which "
        f"a command through the database cannot reach; operate a copy on its instance's "
        f"admin endpoint{body} ({'; '.join(where)})"
    )


def build_progress(applied: int, total: int, started: float | None, now: float) -> dict[str, Any]:
    """A building version's ``{"applied", "total", "rate", "eta_seconds"}``: messages per
    second since its build started, and the time left at that rate (None: unknown)."""
    rate = applied / max(now - started, 1e-3) if started is not None else 0.0
    left = max(0, total - applied)
    eta = round(left / rate, 1) if rate > 0 else (0.0 if not left else None)
    return {"applied": applied, "total": total, "rate": round(rate, 1), "eta_seconds": eta}


def _total(db: Database, conn: Connection, topics: list[str], types: list[str]) -> int:
    """How many messages of ``topics`` and ``types`` there are: what a version builds."""
    m = db.schema.messages
    return int(
        conn.execute(
            select(func.count()).where(
                m.c.tenant == db.tenant, m.c.topic.in_(topics), m.c.type.in_(types)
            )
        ).scalar_one()
    )


def instances_report(db: Database, settings: ConsumerSettings) -> dict[str, Any]:
    """``{"instances": [{"id", "name", "host", "pid", "started_at", "heartbeat_at", "live",
    "stopping", "last_heard", "late", "gone", "reads", "upcasters", "applies_nothing_of"}]}``:
    ``last_heard`` is the seconds since its last heartbeat by the database's clock; ``late``
    a live instance whose heartbeat is more than two intervals old (it may have died; it
    turns stale at stale-instance-timeout); ``gone`` why an instance is not live
    (``process gone (lock released)`` or ``heartbeat stale``), None for a live one;
    ``reads``: per consumer it runs, the newest payload version of each stored type name it
    can read (its upcasters' reach); ``upcasters``: per consumer, the upcasters and renames
    it reads older payloads through;
    ``applies_nothing_of``: the consumers its code declares that it does not run, because
    the database replaced their declaration."""
    with db.read() as conn:
        membership = Membership(db)
        rows = membership.instances(conn, settings.stale_instance_timeout)
        published = membership.in_memory(conn)
    late_after = LATE_HEARTBEATS * settings.heartbeat_interval
    return {
        "instances": [
            {
                "id": r.id,
                "name": r.name,
                "host": r.host,
                "pid": r.pid,
                "started_at": r.started_at,
                "heartbeat_at": r.heartbeat_at,
                "live": r.live,
                "stopping": r.stopping,
                "last_heard": round(max(0.0, settings.stale_instance_timeout - r.expires_in), 3),
                "late": r.live and r.expires_in < settings.stale_instance_timeout - late_after,
                "gone": r.gone_because,
                "reads": {c: dict(run.get("reads", {})) for c, run in sorted(r.runs.items())},
                "upcasters": {
                    c: list(run.get("upcasters", [])) for c, run in sorted(r.runs.items())
                },
                "applies_nothing_of": sorted(stale_of(published, r.id)),
            }
            for r in rows
        ]
    }


def format_consumers(report: dict[str, Any]) -> str:
    """The consumers report as a plain-text table."""
    lines = []
    for consumer in report["consumers"]:
        state = f"version {consumer['version']}, {consumer['state']}"
        if "build" in consumer:
            b = consumer["build"]
            state = f"version {consumer['version']} of {consumer['version_of']}, building: "
            state += f"{b['applied']}/{b['total']} applied, {b['rate']}/s, " + (
                "time left unknown" if b["eta_seconds"] is None else f"{b['eta_seconds']} s left"
            )
        lines.append(
            f"{consumer['name']}  ({consumer['kind']}, {consumer['distribution']}, {state})"
        )
        lines.append(
            f"  {'partition':>9}  {'state':<10} {'status':<8} {'checkpoint':>10} "
            f"{'lag':>8}  instance"
        )
        for p in consumer["partitions"]:
            lines.append(
                f"  {p['partition']:>9}  {p['state']:<10} {p['status']:<8} {p['checkpoint']:>10} "
                f"{p['lag']:>8}  {p['instance'] or '-'}"
            )
            lines += _halted(p, f"  {'':>9}  ")
            if p.get("parked_sources"):
                lines.append(
                    f"  {'':>9}  {p['parked_sources']} parked sources "
                    f"(projections parked {consumer['name']})"
                )
            if "waiting" in p:
                lines.append(f"  {'':>9}  waiting: it {p['waiting']}")
    for consumer in report.get("in_memory", []):
        lines.append(f"{consumer['name']}  ({IN_MEMORY}, each instance runs its own copy)")
        lines.append(f"  {'instance':<30} {'state':<8} {'position':>10} {'lag':>8}  admin")
        for c in consumer["instances"]:
            lines.append(
                f"  {c['instance']:<30} {c['state']:<8} {c['position']:>10} {c['lag']:>8}  "
                f"{c['admin'] or '-'}"
            )
            lines += _halted(c, "  ")
            if "waiting" in c:
                w = c["waiting"]
                lines.append(f"  waiting at position {w['position']}: it {w['reason']}")
    return "\n".join(lines) if lines else "no consumers declared yet"


def _halted(entry: dict[str, Any], indent: str) -> list[str]:
    """The line about a halted partition or copy's poison message, if it has one."""
    if "halted" not in entry:
        return []
    h = entry["halted"]
    return [f"{indent}halted at position {h['position']} ({h['type']}): {h['error']}"]


def format_instances(report: dict[str, Any]) -> str:
    """The instances report as a plain-text table with a header, one instance a line."""
    if not report["instances"]:
        return "no instances registered"
    lines = [f"{'name':<30} {'state':<8} {'last heard':<18} {'host:pid':<24} id"]
    for row in report["instances"]:
        state = (
            ("stale" if row.get("gone", STALE) == STALE else "gone")
            if not row["live"]
            else "stopping"
            if row["stopping"]
            else "late"
            if row["late"]
            else "live"
        )
        heard = f"{row['last_heard']:.1f} s ago"
        where = f"{row['host']}:{row['pid']}"
        lines.append(f"{row['name']:<30} {state:<8} {heard:<18} {where:<24} {row['id']}")
        for name in row.get("applies_nothing_of", []):
            lines.append(
                f"  applies nothing of {name}: the database replaced its declaration (deploy "
                f"the current code to it, or `projections rollback {name}`)"
            )
    return "\n".join(lines)


def format_time(epoch: float) -> str:
    """Seconds since the epoch as local time to the millisecond, with its UTC offset:
    ``2026-11-30 10:17:46.123 +0000``."""
    moment = datetime.fromtimestamp(epoch).astimezone()
    return (
        moment.strftime("%Y-%m-%d %H:%M:%S.")
        + f"{moment.microsecond // 1000:03d}"
        + (moment.strftime(" %z"))
    )
