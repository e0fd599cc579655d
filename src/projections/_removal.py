"""Removing a consumer the running code no longer declares: ``projections remove``.

Deleting a consumer's declaration and deploying leaves its rows behind: its consumer row
(so ``health`` would report it unowned for ever), its versions, partitions, parked and
skipped messages, a route consumer's handled ids, a saga's states and deadlines, and a
projection's tables. :func:`remove` deletes all of it in one audited transaction, and
is refused while a live instance declares the consumer (it would be applying it).

The tables of a projection's other versions (kept for a rollback, or being built) are
dropped: there is nothing left to roll back. Its live tables are dropped with
``drop_tables``; otherwise they are kept for the operator, registered as left by the
removed consumer (:data:`~messaging.operations.REMOVED_MARK`): a later declaration of a
table of that name is refused until ``remove NAME --drop-tables`` drops them, so that no
new consumer applies its messages again into rows it did not write.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, inspect, select, update

from messaging import Database, OperationError
from messaging.operations import (
    Membership,
    bump_generation,
    drop_tables_if_exist,
    kind_named,
    removed_owner,
    split_unit,
    unit_rows,
    unknown_consumer,
)
from projections._operations import DEFAULT_STALE_TIMEOUT, _audit, _once, check_reason


def remove(
    db: Database,
    consumer: str,
    *,
    who: str,
    reason: str = "",
    drop_tables: bool = False,
    stale_timeout: float = DEFAULT_STALE_TIMEOUT,
) -> dict[str, Any]:
    """Remove ``consumer`` and everything stored of it (its messages stay: topics are
    shared); with ``drop_tables`` drop its live tables too, otherwise keep them. Refused
    while a live instance (by ``stale_timeout``) declares it. Of a consumer removed
    before with its tables kept, ``drop_tables`` drops them. Returns ``{"consumer",
    "kind", "versions", "rows", "dropped", "kept"}``: what was deleted (the versions'
    numbers, the rows by table) and the tables dropped and kept."""
    check_reason(reason)
    name, version = split_unit(consumer)
    if version is not None:
        raise OperationError(
            f"{consumer!r} is version {version} of {name!r}: remove {name!r}, or drop a "
            f"retired version with `projections drop-version {name} {version}`"
        )

    def body(conn: Connection, command_id: str) -> dict[str, Any]:
        removed = _remove_rows(db, conn, consumer, drop_tables, stale_timeout)
        detail = {"reason": reason, **removed}
        _audit(db, conn, "remove", consumer, who, detail, command_id)
        bump_generation(db, conn)
        return removed

    removed = _once(db, "remove", body, _without_reason)
    drop_tables_if_exist(db, removed["dropped"])
    return {"consumer": consumer, **removed}


def _without_reason(detail: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in detail.items() if k != "reason"}


def _remove_rows(
    db: Database, conn: Connection, consumer: str, drop_tables: bool, stale_timeout: float
) -> dict[str, Any]:
    """Delete the rows of ``consumer`` and of its versions (in ``conn``'s transaction),
    and drop or keep its tables in the registry; what :func:`remove` returns."""
    c = db.schema.consumers
    kind = conn.execute(
        select(c.c.kind).where(c.c.tenant == db.tenant, c.c.name == consumer).with_for_update()
    ).scalar_one_or_none()
    kept = _kept_tables(db, conn, consumer)
    if kind is None and kept and drop_tables:  # removed before, its tables kept
        _unregister(db, conn, removed_owner(consumer))
        return {"kind": None, "versions": [], "rows": {}, "dropped": kept, "kept": []}
    if kind is None:
        known = conn.execute(select(c.c.name).where(c.c.tenant == db.tenant)).scalars()
        if kept:
            raise OperationError(
                f"consumer {consumer!r} was removed and its tables {', '.join(kept)} kept: "
                f"`projections remove {consumer} --drop-tables` drops them"
            )
        raise OperationError(unknown_consumer(consumer, (n for n in known if "@" not in n)))
    _, declaring = Membership(db).declaring(conn, stale_timeout, consumer)
    if declaring:
        who = ", ".join(f"{m.name} (pid {m.pid} on {m.host})" for m in declaring)
        raise OperationError(
            f"consumer {consumer!r} is declared by the code of live instance(s) {who}: "
            "deploy code without it to every instance first, then remove it"
        )
    units = unit_rows(db, conn, [consumer])
    names = sorted({consumer, *(u.unit for u in units)})
    present = {t.lower() for t in inspect(conn).get_table_names()}
    live_tables = [t for t in _live_tables(db, conn, consumer) if t.lower() in present]
    versions_tables = [t for u in units if not u.live and not u.dropped for t in u.tables]
    rows = _delete_rows(db, conn, kind, names)
    if not drop_tables and live_tables:  # kept: registered as left by the removal
        r = db.schema.read_models
        conn.execute(
            update(r)
            .where(
                r.c.tenant == db.tenant,
                r.c.consumer == consumer,
                r.c.table_name.in_(live_tables),
            )
            .values(consumer=removed_owner(consumer))
        )
    _unregister(db, conn, consumer)  # the names of tables dropped, or gone before
    return {
        "kind": kind,
        "versions": sorted(u.version for u in units),
        "rows": rows,
        "dropped": versions_tables + (live_tables if drop_tables else []),
        "kept": [] if drop_tables else live_tables,
    }


def _delete_rows(db: Database, conn: Connection, kind: str, names: list[str]) -> dict[str, int]:
    """Delete the rows naming any of ``names`` (a consumer and its versions) from the
    engine's tables and from those of its kind; how many of each table."""
    s = db.schema
    tables = [
        (s.partitions, "consumer"),
        (s.parked, "consumer"),
        (s.skipped, "consumer"),
        (s.processed, "consumer"),
        *((getattr(s, t), column) for t, column in kind_named(kind).rows_by_consumer.items()),
        (s.consumers, "name"),
    ]
    counts = {}
    for table, column in tables:
        gone = conn.execute(
            delete(table).where(table.c.tenant == db.tenant, table.c[column].in_(names))
        ).rowcount
        counts[table.name.removeprefix(s.prefix)] = int(gone)
    return counts


def _live_tables(db: Database, conn: Connection, owner: str) -> list[str]:
    """The read-model tables registered to ``owner``, by name."""
    r = db.schema.read_models
    return sorted(
        conn.execute(
            select(r.c.table_name).where(r.c.tenant == db.tenant, r.c.consumer == owner)
        ).scalars()
    )


def _kept_tables(db: Database, conn: Connection, consumer: str) -> list[str]:
    """The tables a removal of ``consumer`` kept."""
    return _live_tables(db, conn, removed_owner(consumer))


def _unregister(db: Database, conn: Connection, owner: str) -> None:
    r = db.schema.read_models
    conn.execute(delete(r).where(r.c.tenant == db.tenant, r.c.consumer == owner))
