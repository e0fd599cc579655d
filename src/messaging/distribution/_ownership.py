"""Partition ownership: claims with epochs, the fenced checkpoint, release and halt.

A row's ``updated_at`` is when it last changed: a claim, a release, a halt, an operator's
command, or a checkpoint that advanced (what the health verdicts call progress).

Every claim bumps the partition's epoch. A checkpoint (and so every effect written in
the same transaction) commits only with ``WHERE owner = me AND epoch = my_epoch``; if
that matches fewer rows than expected, ownership moved on and the whole transaction
rolls back. Two instances may briefly *believe* they own a partition, but only the
holder of the current epoch can *commit*.

The update also names the checkpoint it replaces (a compare-and-set): a batch whose
commit went through but whose acknowledgement was lost (a connection cut during COMMIT)
matches no row when applied again, and rolls back (:class:`CheckpointMoved`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Connection,
    Select,
    Table,
    Update,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from messaging._errors import CheckpointMoved, OwnershipLost
from messaging._states import PartitionStatus
from messaging.distribution._claimable import claim_held_back, left_since_read
from messaging.store import _fastpath
from messaging.store._built import per_table
from messaging.store._clock import cached_now, now_params
from messaging.store._database import Database

_FENCE_CACHE_SIZE = 64


@attrs.define(frozen=True, kw_only=True)
class Claim:
    """A partition this instance owns, under ``epoch``, applied up to ``checkpoint``."""

    partition: int
    epoch: int
    checkpoint: int


@attrs.define
class PartitionRow:
    """One row of ``consumer_partitions``, for reports (not frozen: made by the hundred each
    rebalance round, and a frozen class's are several times slower to make)."""

    consumer: str
    partition: int
    owner: str | None
    epoch: int
    checkpoint: int
    status: str
    halted_position: int | None
    halted_type: str | None
    error: str | None
    needs: str | None = None
    """What a newer payload needs to be read, as JSON (``messaging.distribution._needs``)."""


_LISTED = (
    *("consumer", "partition_no", "owner", "epoch", "checkpoint"),
    *("status", "halted_position", "halted_type", "error", "needs"),
)
"""The columns of :meth:`Ownership.partitions`, in the order of :class:`PartitionRow`'s fields."""


@per_table
def _listing(t: Table, count: int) -> Select[Any]:
    """The query of :meth:`Ownership.partitions` on the table ``t``, built once: the tenant
    is its parameter ``t``, the ``count`` consumers ``c0``... (0: every consumer)."""
    query = select(*(t.c[name] for name in _LISTED)).where(t.c.tenant == bindparam("t"))
    if count:
        query = query.where(t.c.consumer.in_([bindparam(f"c{i}") for i in range(count)]))
    return query.order_by(t.c.consumer, t.c.partition_no)


NOT_HALTED: dict[str, None] = {
    "halted_position": None,
    "halted_type": None,
    "error": None,
    "halted_trace": None,
    "halted_at": None,
}
"""The values of a partition row's halt columns when it is not halted."""


class Ownership:
    """Reads and writes the ``consumer_partitions`` table of one tenant."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.schema.partitions
        self._fences: dict[tuple[str, str, tuple[tuple[int, int], ...]], Update] = {}

    def _consumer(self, consumer: str) -> list[ColumnElement[bool]]:
        t = self.table
        return [t.c.tenant == self.db.tenant, t.c.consumer == consumer]

    def ensure_partitions(self, conn: Connection, consumer: str, count: int) -> None:
        """Create the missing rows of partitions ``0..count-1`` (unowned, checkpoint 0)."""
        t = self.table
        existing = set(
            conn.execute(select(t.c.partition_no).where(*self._consumer(consumer))).scalars()
        )
        missing = [p for p in range(count) if p not in existing]
        if missing:
            now = conn.execute(select(self.db.clock.now())).scalar_one()
            conn.execute(
                insert(t),
                [
                    {
                        "tenant": self.db.tenant,
                        "consumer": consumer,
                        "partition_no": p,
                        "owner": None,
                        "epoch": 0,
                        "checkpoint": 0,
                        "status": PartitionStatus.RUNNING,
                        "updated_at": now,
                    }
                    for p in missing
                ],
            )

    def fence_all(self, conn: Connection, consumer: str, *, floor: int = 0) -> None:
        """Take every partition of ``consumer`` from its owner under a new epoch (above
        ``floor`` too): every commit of an earlier claim fails from now on."""
        epoch = max(self.top_epoch(conn, [consumer]), floor) + 1
        conn.execute(
            update(self.table)
            .where(*self._consumer(consumer))
            .values(owner=None, epoch=epoch, updated_at=self.db.clock.now())
        )

    def rename(self, conn: Connection, consumer: str, to: str) -> None:
        """Give the partition rows of ``consumer`` to the consumer named ``to``."""
        t = self.table
        conn.execute(update(t).where(*self._consumer(consumer)).values(consumer=to))

    def top_epoch(self, conn: Connection, consumers: Sequence[str]) -> int:
        """The highest epoch of any partition of ``consumers`` (0 if none)."""
        t = self.table
        top = conn.execute(
            select(func.max(t.c.epoch)).where(
                t.c.tenant == self.db.tenant, t.c.consumer.in_(consumers)
            )
        ).scalar_one_or_none()
        return int(top or 0)

    def claim(
        self,
        conn: Connection,
        consumer: str,
        partitions: Iterable[int],
        instance_id: str,
        live_ids: Select[tuple[str]],
        fingerprint: str | None = None,
        needs_read: Iterable[int] = (),
    ) -> list[Claim]:
        """Claim those of ``partitions`` that are unowned, owned by a non-live instance or already
        by this one (re-claimed under a new epoch), unless :func:`claim_held_back` (paused,
        rebuilt, another declaration, a swap begun) or the partition was left for a newer
        declaration since the round read its rows (``needs_read``: those it read a record of).

        A compare-and-set: the ``UPDATE`` matches only such rows and bumps their epoch.
        Returns the partitions claimed now, with their new epochs.
        """
        t = self.table
        wanted = sorted(partitions)
        if not wanted:
            return []
        held_back = or_(
            claim_held_back(self.db, consumer, fingerprint), left_since_read(t, list(needs_read))
        )
        conn.execute(
            update(t)
            .where(
                *self._consumer(consumer),
                t.c.partition_no.in_(wanted),
                t.c.status == PartitionStatus.RUNNING,
                ~held_back,
                or_(
                    t.c.owner.is_(None),
                    t.c.owner == instance_id,
                    t.c.owner.not_in(live_ids),
                ),
            )
            .values(owner=instance_id, epoch=t.c.epoch + 1, updated_at=self.db.clock.now())
            .execution_options(synchronize_session=False)
        )
        rows = conn.execute(
            select(t.c.partition_no, t.c.epoch, t.c.checkpoint).where(
                *self._consumer(consumer),
                t.c.partition_no.in_(wanted),
                t.c.owner == instance_id,
                t.c.status == PartitionStatus.RUNNING,
            )
        )
        return [Claim(partition=r[0], epoch=r[1], checkpoint=r[2]) for r in rows]

    def commit_checkpoint(
        self,
        conn: Connection,
        consumer: str,
        instance_id: str,
        claims: Mapping[int, Claim],
        position: int,
    ) -> None:
        """Advance the checkpoints of ``claims``' partitions to at least ``position``: a
        compare-and-set on owner, epoch *and* the checkpoint each claim was read from.

        Raises :class:`OwnershipLost` when any partition is no longer owned by
        ``instance_id`` under its claim's epoch, and :class:`CheckpointMoved` when they
        all are but a checkpoint is no longer the claim's (an earlier commit of this
        owner went through unacknowledged): either way the caller must roll back, so a
        batch is never applied twice.
        """
        if not claims:
            return
        pairs = tuple(sorted((p, c.epoch) for p, c in claims.items()))
        key = (consumer, instance_id, pairs)
        statement = self._fences.get(key)
        if statement is None:
            # Built once per set of claims, then reused batch after batch: the position and
            # the expected checkpoints are bound parameters, so SQLAlchemy neither rebuilds
            # nor re-keys the statement, and the driver fast path sends it directly.
            t = self.table
            position_param = bindparam("position", type_=BigInteger)
            statement = (
                update(t)
                .where(
                    *self._consumer(consumer),
                    t.c.owner == instance_id,
                    t.c.status == PartitionStatus.RUNNING,
                    # Plain binds, not an expanding IN: rendered once, not per batch.
                    tuple_(t.c.partition_no, t.c.epoch, t.c.checkpoint).in_(
                        [
                            tuple_(
                                literal(p),
                                literal(e),
                                bindparam(f"expected_{i}", type_=BigInteger),
                            )
                            for i, (p, e) in enumerate(pairs)
                        ]
                    ),
                )
                # updated_at first: MySQL assigns left to right, so a later assignment
                # would compare the checkpoint already advanced.
                .ordered_values(
                    (
                        t.c.updated_at,
                        case(
                            (t.c.checkpoint < position_param, cached_now(self.db.clock)),
                            else_=t.c.updated_at,
                        ),
                    ),
                    (
                        t.c.checkpoint,
                        case(
                            (t.c.checkpoint < position_param, position_param),
                            else_=t.c.checkpoint,
                        ),
                    ),
                )
            )
            if len(self._fences) >= _FENCE_CACHE_SIZE:
                self._fences.clear()
            self._fences[key] = statement
        params: dict[str, Any] = {
            f"expected_{i}": claims[p].checkpoint for i, (p, _) in enumerate(pairs)
        }
        params["position"] = position
        params.update(now_params(self.db.clock))
        updated = _fastpath.execute(
            conn, statement, [params], direct=_fastpath.sends_directly(conn)
        )
        if updated != len(pairs):
            self.verify(conn, consumer, instance_id, claims)
            raise OwnershipLost(consumer, sorted(claims))  # changed and changed back meanwhile

    def verify(
        self, conn: Connection, consumer: str, instance_id: str, claims: Mapping[int, Claim]
    ) -> None:
        """Check ``claims`` against the database: :class:`OwnershipLost` for partitions
        ``instance_id`` no longer holds under the claim's epoch (or that halted),
        :class:`CheckpointMoved` when all are held but a checkpoint differs."""
        held = self.owned(conn, consumer, instance_id, claims)
        lost = sorted(p for p, c in claims.items() if p not in held or held[p].epoch != c.epoch)
        if lost:
            raise OwnershipLost(consumer, lost)
        moved = {p: c.checkpoint for p, c in held.items() if c.checkpoint != claims[p].checkpoint}
        if moved:
            raise CheckpointMoved(consumer, moved)

    def owned(
        self, conn: Connection, consumer: str, instance_id: str, partitions: Iterable[int]
    ) -> dict[int, Claim]:
        """The claims ``instance_id`` holds of ``partitions`` (running ones), as the database
        has them now: the truth to go on after a commit of unknown outcome."""
        t = self.table
        wanted = sorted(partitions)
        if not wanted:
            return {}
        rows = conn.execute(
            select(t.c.partition_no, t.c.epoch, t.c.checkpoint).where(
                *self._consumer(consumer),
                t.c.owner == instance_id,
                t.c.status == PartitionStatus.RUNNING,
                t.c.partition_no.in_(wanted),
            )
        )
        return {r[0]: Claim(partition=r[0], epoch=r[1], checkpoint=r[2]) for r in rows}

    def release(
        self, conn: Connection, consumer: str, instance_id: str, partitions: Iterable[int]
    ) -> None:
        """Give up ``partitions`` that ``instance_id`` still owns."""
        t = self.table
        wanted = sorted(partitions)
        if wanted:
            conn.execute(
                update(t)
                .where(
                    *self._consumer(consumer),
                    t.c.owner == instance_id,
                    t.c.partition_no.in_(wanted),
                )
                .values(owner=None, updated_at=self.db.clock.now())
            )

    def release_all(self, conn: Connection, instance_id: str) -> list[tuple[str, int]]:
        """Give up every partition ``instance_id`` owns (halted ones too); return them."""
        t = self.table
        owned = [
            (consumer, partition)
            for consumer, partition in conn.execute(
                select(t.c.consumer, t.c.partition_no).where(
                    t.c.tenant == self.db.tenant, t.c.owner == instance_id
                )
            )
        ]
        conn.execute(
            update(t)
            .where(t.c.tenant == self.db.tenant, t.c.owner == instance_id)
            .values(owner=None, updated_at=self.db.clock.now())
        )
        return owned

    def halt(
        self,
        conn: Connection,
        consumer: str,
        claim: Claim,
        instance_id: str,
        *,
        position: int,
        type_name: str,
        error: str,
        trace: str | None = None,
    ) -> bool:
        """Halt a partition at a poison message, fenced like a checkpoint; False if not owned.
        ``trace`` is where the handler failed (the last frames of its traceback)."""
        return self.fenced_update(
            conn,
            consumer,
            claim,
            instance_id,
            status=PartitionStatus.HALTED,
            halted_position=position,
            halted_type=type_name,
            error=error,
            halted_trace=trace,
            halted_at=self.db.clock.now(),
        )

    def fenced_update(
        self, conn: Connection, consumer: str, claim: Claim, instance_id: str, **values: Any
    ) -> bool:
        """Set ``values`` on ``claim``'s partition while ``instance_id`` holds it under the
        claim's epoch (and stamp it); False if it does not."""
        t = self.table
        result = conn.execute(
            update(t)
            .where(
                *self._consumer(consumer),
                t.c.partition_no == claim.partition,
                t.c.owner == instance_id,
                t.c.epoch == claim.epoch,
            )
            .values(**values, updated_at=self.db.clock.now())
        )
        return result.rowcount == 1

    def clear_needs(
        self,
        conn: Connection,
        consumer: str,
        instance_id: str,
        partitions: Iterable[int],
        kind: str,
    ) -> None:
        """Forget what ``partitions`` (owned by ``instance_id``) needed, where the record is
        of ``kind`` (its first key; ``messaging.distribution._needs``)."""
        t = self.table
        conn.execute(
            update(t)
            .where(
                *self._consumer(consumer),
                t.c.partition_no.in_(sorted(set(partitions))),
                t.c.owner == instance_id,
                t.c.needs.like(f'{{"{kind}"%'),
            )
            .values(needs=None)
        )

    def partitions(
        self, conn: Connection, consumers: Sequence[str] | None = None
    ) -> list[PartitionRow]:
        """Every partition row of the tenant (or of ``consumers``), ordered."""
        if consumers is not None and not consumers:
            return []  # of no consumer
        names = [] if consumers is None else _fastpath.padded(consumers)
        query = _listing(self.table, len(names))
        params = dict(zip(_fastpath.numbered(("c",), len(names)), names, strict=True))
        params["t"] = self.db.tenant
        rows = _fastpath.fetch(conn, query, params, direct=_fastpath.sends_directly(conn))
        return [PartitionRow(*r) for r in rows]
