"""A version being built takes the live version's place: readers see one or the other whole.

Three steps, each a compare-and-set any instance building the version may take (the
rebalance rounds of those instances try them; a crash between two leaves a state the
next round goes on from):

1. **Stop the live version** once the new one is within a batch of it
   (:func:`ready`): in one transaction the live partitions are fenced, the consumer is
   marked ``cutting-over`` (no claim is granted) and the live checkpoints, final now,
   are recorded in its ``cutover`` column. The new version applies past them
   (:mod:`messaging.versions._gate`).
2. **Swap** once the new version includes everything the live one applied
   (:func:`caught_up`): the new version's partitions are fenced, the live tables are
   renamed to ``_vL__<table>`` and the new ones to the declared names, the partition
   rows and the ``consumers`` rows change places (``name`` is the new version, ``name@L``
   the retired one). On SQLite all of it is one transaction (its DDL is transactional).
   On MySQL/MariaDB the tables change places in one ``RENAME TABLE`` statement (atomic,
   and replicated in total order on Galera); the rows before it (marking the swap and
   fencing the new version) and after it are two transactions, and an instance finding
   a swap marked redoes what is missing. The rename waits a second at most
   (:mod:`messaging.store._ddl`) for the metadata locks of readers' open transactions on
   the tables (statements on them queue behind it meanwhile), then gives up for 2, 4, 8...
   30 s (logged): a long reader delays the swap, never stalls other readers for long.
3. The new version's partitions are claimed again under the declared names, by the
   instances running its declaration; the others retire the consumer.

Readers see the old version until the swap (its last state stays put from step 1),
then the new one, which includes every message the old one had applied.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import attrs
from sqlalchemy import Connection, delete, func, inspect, select, update
from sqlalchemy.exc import OperationalError, ProgrammingError

from messaging._consumers import ConsumerSpec
from messaging._lifecycle import lifecycle_event
from messaging._states import ConsumerState
from messaging.distribution._ownership import Ownership, PartitionRow
from messaging.distribution._pulse import bump_generation
from messaging.failures._parking import swap_parked
from messaging.store._database import Database
from messaging.store._ddl import bounded_lock_wait
from messaging.store._retry import lock_conflict
from messaging.store._rows import POSITION
from messaging.store._store import MessageStore
from messaging.store._table_registry import register
from messaging.store._tenancy import ReadModels
from messaging.versions._gate import VersionGate
from messaging.versions._halted_build import halted_partition, resume_live
from messaging.versions._retired import drop_retired
from messaging.versions._versions import UnitRow, seconds_now, unit_name, unit_rows

log = logging.getLogger("messaging.runtime.cutover")

RACED = {1146, 1050}
"""MySQL/MariaDB's "Table ... doesn't exist" and "Table ... already exists": what a
rename finds when another instance of the version renamed the tables first."""


def behind(
    db: Database,
    conn: Connection,
    unit: UnitRow,
    spec: ConsumerSpec,
    limit: int,
    partitions: Sequence[PartitionRow],
) -> int:
    """How many messages the live version applied that version ``unit`` (whose partition
    rows are ``partitions``) has not (counted among the next ``limit`` after its
    checkpoints; ``limit`` means at least that many)."""
    gate = VersionGate(db, unit.name)
    gate.read(conn)
    checkpoints = {r.partition: r.checkpoint for r in partitions}
    rows = MessageStore(db).read_batch(
        conn,
        spec.topics,
        partitions=checkpoints,
        partition_count=spec.partitions,
        types=list(unit.types),
        limit=limit,
    )
    counted = gate.behind(rows)
    full = len(rows) >= limit and rows[-1][POSITION] <= max(gate.checkpoints.values(), default=0)
    return max(counted, limit) if full else counted


def step(db: Database, spec: ConsumerSpec, unit: str, batch_size: int, keep: int) -> None:
    """Take the next cutover step of version ``unit`` of ``spec``, if it is due; after a
    swap, drop the retired versions beyond the ``keep`` latest
    (:func:`~messaging.versions._retired.drop_retired`)."""
    with db.read() as conn:
        rows = {r.unit: r for r in unit_rows(db, conn, [spec.name])}
        building, live = rows.get(unit), rows.get(spec.name)
        if building is None or live is None or not building.building:
            return
        cutover = live.cutover
        partitions = Ownership(db).partitions(conn, [building.unit])
        halted = None
        if cutover is None or not cutover.get("swapping"):
            halted = halted_partition(partitions)
        if cutover is None:
            if live.state != ConsumerState.RUNNING:
                return  # paused by an operator, or a rebuild request not taken yet
            if (
                halted is not None
                or behind(db, conn, building, spec, batch_size, partitions) >= batch_size
            ):
                return
        elif cutover["version"] != building.version or (
            halted is None
            and not cutover.get("swapping")
            and behind(db, conn, building, spec, batch_size, partitions)
        ):
            return
    if cutover is None:
        _stop_live(db, live, building)
    elif halted is not None:
        resume_live(db, live, building, halted)
    else:
        _swap(db, spec, live, building, keep)


def _stop_live(db: Database, live: UnitRow, building: UnitRow) -> None:
    """Step 1: fence the live version and record its final checkpoints."""
    t, ownership = db.schema.consumers, Ownership(db)
    with db.transaction() as conn:
        still = conn.execute(
            select(t.c.state).where(t.c.tenant == db.tenant, t.c.name == building.unit)
        ).scalar_one_or_none()
        if still != ConsumerState.RUNNING:  # replaced, or live already (rows read before)
            return
        taken = conn.execute(
            update(t)
            .where(
                t.c.tenant == db.tenant,
                t.c.name == live.unit,
                t.c.state == ConsumerState.RUNNING,
                t.c.cutover.is_(None),
                func.coalesce(t.c.version, 1) == live.version,
            )
            .values(state=ConsumerState.CUTTING_OVER, updated_at=db.clock.now())
        ).rowcount
        if taken != 1:
            return
        ownership.fence_all(conn, live.unit)
        checkpoints = {r.partition: r.checkpoint for r in ownership.partitions(conn, [live.unit])}
        cutover = {
            "version": building.version,
            "partitions": live.partitions,
            "checkpoints": {str(p): c for p, c in checkpoints.items()},
        }
        conn.execute(
            update(t)
            .where(t.c.tenant == db.tenant, t.c.name == live.unit)
            .values(cutover=json.dumps(cutover))
        )
        bump_generation(db, conn)
    lifecycle_event(
        "cutover",
        consumer=live.name,
        version=building.version,
        live=live.version,
        reason="the new version is within a batch: the live version stopped applying",
    )


def _swap(db: Database, spec: ConsumerSpec, live: UnitRow, building: UnitRow, keep: int) -> None:
    """Step 2: the tables, partitions and rows of the two versions change places."""
    assert live.cutover is not None
    with db.read() as conn:
        if seconds_now(db, conn) < float(live.cutover.get("rename_after", 0)):
            return
    if db.is_sqlite:
        renames = _renames(db, spec, live, building)
        with db.read() as conn:
            if _blocked(db, conn, live, renames):
                return
        with db.transaction() as conn:
            swapped = _swap_marked(db, conn, live, building, mark=False)
            if swapped:
                for old, new in renames.items():
                    conn.exec_driver_sql(f'ALTER TABLE "{old}" RENAME TO "{new}"')
                _swap_rows(db, conn, spec, live, building, _retired_tables(renames, live))
        if swapped:
            drop_retired(db, live.name, keep)
        return
    if not live.cutover.get("swapping"):
        # The renames are listed now, while no rename can be under way, and recorded for
        # every instance of the version: MariaDB's table listing during another's RENAME
        # TABLE may show it half done.
        renames = _renames(db, spec, live, building)
        with db.transaction() as conn:
            if not _swap_marked(db, conn, live, building, mark=True, renames=renames):
                return
        live = attrs.evolve(live, cutover={**live.cutover, "swapping": True, "renames": renames})
    assert live.cutover is not None  # as written
    renames = live.cutover.get("renames") or _renames(db, spec, live, building)
    if not _rename_tables(db, spec, live, building, renames):
        return
    with db.transaction() as conn:
        swapped = _swap_marked(db, conn, live, building, mark=False, swapping=True)
        if swapped:
            _swap_rows(db, conn, spec, live, building, _retired_tables(renames, live))
    if swapped:
        drop_retired(db, live.name, keep)


def _rename_tables(
    db: Database, spec: ConsumerSpec, live: UnitRow, building: UnitRow, renames: Mapping[str, str]
) -> bool:
    """MySQL/MariaDB: rename every table of the swap in one ``RENAME TABLE``; whether they
    are renamed (here, or by another instance of the version first). The rename waits a
    second at most for readers' metadata locks; after a wait ran out, no instance tries
    again before :func:`_rename_backoff` has passed (recorded on the live row)."""
    with db.engine.connect() as conn:
        present = set(inspect(conn).get_table_names())
        pending = {old: new for old, new in renames.items() if old in present}
        first_new = ReadModels(db.tenant, building.version).tables(spec.options.tables)
        if not any(t.name in present for t in first_new):
            return True  # renamed already (all or none)
        if _blocked(db, conn, live, pending):
            return False
        try:
            with bounded_lock_wait(conn):
                conn.exec_driver_sql(
                    "RENAME TABLE " + ", ".join(f"`{a}` TO `{b}`" for a, b in pending.items())
                )
        except (OperationalError, ProgrammingError) as exc:
            code = next(iter(getattr(exc.orig, "args", ())), None)
            present = set(inspect(conn).get_table_names())
            if code in RACED and not any(t.name in present for t in first_new):
                return True  # another instance of the version renamed them first
            if _blocked(db, conn, live, pending):
                return False
            if lock_conflict(exc) != "lock-wait-timeout":
                raise
            _rename_backoff(
                db, live, f"waits for open transactions on {', '.join(sorted(pending))}"
            )
            return False
    return True


def _blocked(db: Database, conn: Connection, live: UnitRow, renames: Mapping[str, str]) -> bool:
    """Whether a table not of the swap holds a name the swap renames a table to (the
    swap then waits, :func:`_rename_backoff`, for an operator to move it)."""
    present = set(inspect(conn).get_table_names())
    in_way = sorted(new for new in renames.values() if new in present and new not in renames)
    if in_way:
        _rename_backoff(
            db, live, f"cannot rename tables to {', '.join(in_way)}: tables by those names exist"
        )
    return bool(in_way)


def _rename_backoff(db: Database, live: UnitRow, why: str) -> None:
    """After a rename could not be done (it gave up waiting for readers, or a table is in
    the way): the next attempt comes 2, 4, 8... up to 30 seconds later (recorded on the
    live row, for every instance), so that the readers queued behind each attempt (a
    second at most) get the time between to themselves."""
    assert live.cutover is not None
    attempts = int(live.cutover.get("rename_attempts", 0)) + 1
    delay = min(30.0, 2.0**attempts)
    t = db.schema.consumers
    with db.transaction() as conn:
        after = seconds_now(db, conn) + delay
        conn.execute(
            update(t)
            .where(
                t.c.tenant == db.tenant,
                t.c.name == live.unit,
                t.c.state == ConsumerState.CUTTING_OVER,
                t.c.cutover == json.dumps(live.cutover),
            )
            .values(
                cutover=json.dumps(
                    {**live.cutover, "rename_after": after, "rename_attempts": attempts}
                )
            )
        )
    log.warning(  # the readers queued behind it go on meanwhile
        "%s: the swap to version %d %s; trying again in %.0f s",
        live.name,
        live.cutover["version"],
        why,
        delay,
    )


def _retired_tables(renames: Mapping[str, str], live: UnitRow) -> list[str]:
    """The tables the live version keeps once retired (``_vL__<table>``)."""
    return sorted(new for new in renames.values() if new.startswith(f"_v{live.version}__"))


def _renames(
    db: Database, spec: ConsumerSpec, live: UnitRow, building: UnitRow
) -> Mapping[str, str]:
    """The table renames of the swap, in order: the live tables (those registered for
    the consumer and those its new version declares) out of the way, then the new
    version's under the declared names."""
    new = ReadModels(db.tenant, building.version).tables(spec.options.tables)
    declared = db.read_models.tables(spec.options.tables)
    with db.read() as conn:
        r = db.schema.read_models
        registered = conn.execute(
            select(r.c.table_name).where(r.c.tenant == db.tenant, r.c.consumer == spec.name)
        ).scalars()
        present = set(inspect(conn).get_table_names())
    old = sorted({*registered, *(d.name for d in declared)} & present)
    renames = {name: f"_v{live.version}__{name}" for name in old}
    renames.update({v.name: d.name for v, d in zip(new, declared, strict=True)})
    return renames


def _swap_marked(
    db: Database,
    conn: Connection,
    live: UnitRow,
    building: UnitRow,
    *,
    mark: bool,
    swapping: bool = False,
    renames: Mapping[str, str] | None = None,
) -> bool:
    """Whether the swap of ``building`` is still to do (the rows read again in ``conn``'s
    transaction, locked); with ``mark``, record that it started with its ``renames`` and
    fence the new version (MySQL: before the tables change places)."""
    t = db.schema.consumers
    row = conn.execute(
        select(t.c.state, t.c.cutover)
        .where(t.c.tenant == db.tenant, t.c.name == live.unit)
        .with_for_update()
    ).one_or_none()
    unit = conn.execute(
        select(t.c.state).where(t.c.tenant == db.tenant, t.c.name == building.unit)
    ).scalar_one_or_none()
    if row is None or row.state != ConsumerState.CUTTING_OVER or unit != ConsumerState.RUNNING:
        return False
    cutover = json.loads(row.cutover or "{}")
    if cutover.get("version") != building.version or bool(cutover.get("swapping")) != swapping:
        return False
    if mark:
        Ownership(db).fence_all(conn, building.unit)
        conn.execute(
            update(t)
            .where(t.c.tenant == db.tenant, t.c.name == live.unit)
            .values(cutover=json.dumps({**cutover, "swapping": True, "renames": renames}))
        )
    return True


def _swap_rows(
    db: Database,
    conn: Connection,
    spec: ConsumerSpec,
    live: UnitRow,
    building: UnitRow,
    retired_tables: list[str],
) -> None:
    """The partition and ``consumers`` rows of the two versions change places; every
    partition of both gets a new epoch above any either had. The retired row records its
    tables and the version that replaced it (a rollback's target)."""
    t, ownership = db.schema.consumers, Ownership(db)
    retired = unit_name(live.name, live.version)
    floor = ownership.top_epoch(conn, [live.unit, building.unit])
    p = db.schema.partitions
    conn.execute(delete(p).where(p.c.tenant == db.tenant, p.c.consumer == retired))
    conn.execute(delete(t).where(t.c.tenant == db.tenant, t.c.name == retired))
    ownership.rename(conn, live.unit, retired)
    ownership.rename(conn, building.unit, live.unit)
    swap_parked(db, conn, live.unit, retired, building.unit)
    ownership.fence_all(conn, retired, floor=floor)
    ownership.fence_all(conn, live.unit, floor=floor)
    old = (
        conn.execute(select(t).where(t.c.tenant == db.tenant, t.c.name == live.unit))
        .one()
        ._asdict()
    )
    new = (
        conn.execute(select(t).where(t.c.tenant == db.tenant, t.c.name == building.unit))
        .one()
        ._asdict()
    )
    carried = ("kind", "distribution", "partitions", "topics", "types", "fingerprint")
    retired_list: list[str] = json.loads(old["retired_fingerprints"] or "[]")
    if old["fingerprint"] != new["fingerprint"]:
        retired_list = [f for f in retired_list if f != new["fingerprint"]]
        retired_list.append(old["fingerprint"])
    now = db.clock.now()
    conn.execute(
        update(t)
        .where(t.c.tenant == db.tenant, t.c.name == building.unit)
        .values(name=retired, state=ConsumerState.RETIRED, updated_at=now, version=live.version)
        .values({c: old[c] for c in carried})
        .values(
            cutover=json.dumps(
                {
                    "tables": retired_tables,
                    "retired_by": building.version,
                    "retired_at": seconds_now(db, conn),
                }
            )
        )
    )
    conn.execute(
        update(t)
        .where(t.c.tenant == db.tenant, t.c.name == live.unit)
        .values({c: new[c] for c in carried})
        .values(
            state=ConsumerState.RUNNING,
            version=building.version,
            cutover=None,
            rebuild_target=None,
            previous_fingerprint=old["fingerprint"],
            retired_fingerprints=json.dumps(retired_list),
            updated_at=now,
        )
    )
    register(db, conn, spec.name, db.read_models.tables(spec.options.tables))
    bump_generation(db, conn)
    lifecycle_event(
        "live",
        consumer=live.name,
        version=building.version,
        retired=live.version,
        reason="the new version took over in one commit",
    )
