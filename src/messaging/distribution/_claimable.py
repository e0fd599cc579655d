"""When no partition of a consumer may be claimed: the condition each claim's
compare-and-set checks (:meth:`messaging.distribution._ownership.Ownership.claim`)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Table, and_, or_, select
from sqlalchemy.sql.elements import ColumnElement

from messaging._states import ConsumerState
from messaging.store._database import Database

SWAPPING = '"swapping": true'
"""How a live version's ``cutover`` JSON says that the swap with a new version began
(``json.dumps`` of ``{..., "swapping": True}``, :mod:`messaging.versions._cutover`)."""


def claim_held_back(db: Database, consumer: str, fingerprint: str | None) -> ColumnElement[bool]:
    """True while ``consumer`` may not be claimed: an operator paused it or it is being
    rebuilt, or (``fingerprint`` given) it runs another declaration now, or it is a version
    whose swap began (fenced for the rename of its tables: a batch after it would find
    them gone)."""
    consumers = db.schema.consumers
    held_back: ColumnElement[bool] = (
        select(consumers.c.name)
        .where(
            consumers.c.tenant == db.tenant,
            consumers.c.name == consumer,
            or_(
                consumers.c.state != ConsumerState.RUNNING,
                *([] if fingerprint is None else [consumers.c.fingerprint != fingerprint]),
            ),
        )
        .exists()
    )
    name, mark, number = consumer.rpartition("@")
    if mark and number.isdigit():  # a version being built: not once its swap began
        live = consumers.alias("live")
        swapping = (
            select(live.c.name)
            .where(
                live.c.tenant == db.tenant,
                live.c.name == name,
                live.c.cutover.contains(SWAPPING),
            )
            .exists()
        )
        held_back = or_(held_back, swapping)
    return held_back


def left_since_read(partitions: Table, needs_read: Collection[int]) -> ColumnElement[bool]:
    """True for a partition row that records what it needs (left for a newer declaration,
    :mod:`messaging.distribution._needs`) unless it is one of ``needs_read``, those whose
    record the claiming round read: a round planned from rows read before a leave does
    not claim the partition back."""
    return and_(partitions.c.needs.is_not(None), partitions.c.partition_no.not_in(needs_read))
