"""A version being built that halts must not hold its live version stopped: no cutover
starts while one of its partitions is halted, and one that started goes back (the live
version applies again) until an operator resumes the version
(:mod:`messaging.versions._cutover`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from sqlalchemy import Select, select, update

from messaging._lifecycle import lifecycle_event
from messaging._states import ConsumerState, PartitionStatus
from messaging.distribution._ownership import PartitionRow
from messaging.distribution._pulse import bump_generation
from messaging.store._database import Database
from messaging.store._retry import is_ambiguous
from messaging.versions._versions import UnitRow


def halted_partition(partitions: Sequence[PartitionRow]) -> PartitionRow | None:
    """A halted one of the partitions of the version being built, if any: no cutover
    starts while one is, and one that started goes back (:func:`resume_live`)."""
    return next((row for row in partitions if row.status == PartitionStatus.HALTED), None)


def resume_live(db: Database, live: UnitRow, building: UnitRow, halted: PartitionRow) -> None:
    """Step 1 undone: the version being built halted while the live version waits for it
    (a message it fails on, say one the live version's operator skipped), so the live
    version applies again (its partitions are claimed anew at the next rounds) instead
    of staying stopped until an operator resumes the version. The cutover starts over
    once the version is resumed and within a batch again. Said once in the log, also when
    the commit's acknowledgement is lost (the retried round finds nothing left to undo)."""
    try:
        undone = _undo(db, live, building)
    except Exception as exc:
        if is_ambiguous(exc) and _undone_already(db, live):
            _say_cancelled(live, building, halted)  # it committed; the error goes on
        raise
    if undone:
        _say_cancelled(live, building, halted)


def _undo(db: Database, live: UnitRow, building: UnitRow) -> bool:
    """Let the live version apply again, if it still waits for ``building``'s cutover."""
    t = db.schema.consumers
    with db.transaction() as conn:
        row = conn.execute(_state_and_cutover(db, live).with_for_update()).one_or_none()
        if row is None or row.state != ConsumerState.CUTTING_OVER:
            return False
        cutover = json.loads(row.cutover or "{}")
        if cutover.get("version") != building.version or cutover.get("swapping"):
            return False  # another version's, or the swap began: it goes on
        conn.execute(
            update(t)
            .where(t.c.tenant == db.tenant, t.c.name == live.unit)
            .values(state=ConsumerState.RUNNING, cutover=None, updated_at=db.clock.now())
        )
        bump_generation(db, conn)
    return True


def _undone_already(db: Database, live: UnitRow) -> bool:
    """Whether the live version applies again with no cutover (an undo whose outcome was
    lost went through); False when that cannot be read now."""
    try:
        with db.read() as conn:
            row = conn.execute(_state_and_cutover(db, live)).one_or_none()
    except Exception:
        return False
    return row is not None and row.state == ConsumerState.RUNNING and row.cutover is None


def _state_and_cutover(db: Database, live: UnitRow) -> Select[tuple[str, str | None]]:
    """The live version's state and cutover record."""
    t = db.schema.consumers
    return select(t.c.state, t.c.cutover).where(t.c.tenant == db.tenant, t.c.name == live.unit)


def _say_cancelled(live: UnitRow, building: UnitRow, halted: PartitionRow) -> None:
    error = ((halted.error or "").splitlines() or [""])[0]
    lifecycle_event(
        "cutover-cancelled",
        level=logging.WARNING,
        consumer=live.name,
        version=building.version,
        partition=halted.partition,
        position=halted.halted_position,
        reason=f"version {building.version} halted ({error}): the live version applies "
        f"again; resume {building.unit} to take it over",
    )
