"""The claims one worker applies under, kept as the fenced commits answer.

Every commit of a worker checks its claims' owner and epoch (and checkpoints) in the
database (:meth:`~messaging.distribution._ownership.Ownership.commit_checkpoint`). This
is the one place that acts on the answer, for projections, route consumers and sagas
alike (:meth:`Fence.guard`): a lost fence drops the partitions, said once; a checkpoint
found already moved (an earlier commit went through unacknowledged) is taken from the
database; an error of unknown outcome makes every claim be read again before the next
batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TypeVar

import attrs
from sqlalchemy import Connection

from messaging._consumers import ConsumerSpec
from messaging._errors import CheckpointMoved, OwnershipLost
from messaging._lifecycle import Identity, lifecycle_event
from messaging._settings import ConflictRetrySettings
from messaging.applying._holdings import Holdings
from messaging.distribution._ownership import Claim, Ownership
from messaging.failures._parking import Parking
from messaging.store._database import Database
from messaging.store._retry import is_ambiguous, report_batch_retry, retry_transient

T = TypeVar("T")


class Fence:
    """The claims of one consumer's worker (in its :class:`Holdings`) and what its fenced
    commits tell of them; thread-safe."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        who: Identity,
        holdings: Holdings,
        parking: Parking | None,
    ) -> None:
        self._db, self._spec, self._who = db, spec, who
        self._holdings, self._parking = holdings, parking
        self.ownership = Ownership(db)
        self.stale = False
        """An error of unknown outcome happened: read every claim again before the next
        batch (our commit may have gone through unacknowledged)."""

    # -- the claims, as the rebalance rounds change them ---------------------------------

    def add(self, claims: Sequence[Claim]) -> None:
        """Apply these newly claimed partitions from now on (their parked sources read)."""
        if self._parking is not None:
            self._parking.reload([claim.partition for claim in claims])
        with self._holdings.lock:
            for claim in claims:
                self._holdings.claims[claim.partition] = claim

    def drop(self, partitions: Sequence[int]) -> None:
        """Apply these partitions no more (released or lost)."""
        with self._holdings.lock:
            for partition in partitions:
                self._holdings.claims.pop(partition, None)
        if self._parking is not None:
            self._parking.forget(partitions)

    def claims(self) -> dict[int, Claim]:
        """A snapshot of the partitions applied here."""
        with self._holdings.lock:
            return dict(self._holdings.claims)

    def advance(self, applied: Mapping[int, Claim], position: int) -> None:
        """After a commit under ``applied``: their checkpoints are at ``position`` now
        (unless claimed again meanwhile)."""
        with self._holdings.lock:
            held = self._holdings.claims
            for partition, claim in applied.items():
                current = held.get(partition)
                if (
                    current is not None
                    and current.epoch == claim.epoch
                    and current.checkpoint < position
                ):
                    held[partition] = Claim(
                        partition=partition, epoch=claim.epoch, checkpoint=position
                    )

    # -- the fenced commit and what it answers -------------------------------------------

    def commit(self, conn: Connection, claims: Mapping[int, Claim], position: int) -> None:
        """In the batch's transaction ``conn``: move ``claims``' checkpoints to ``position``,
        fenced by their owner, epoch and checkpoint (raises :class:`OwnershipLost` or
        :class:`CheckpointMoved`, which roll the transaction back: see :meth:`guard`)."""
        self.ownership.commit_checkpoint(conn, self._spec.name, self._who.id, claims, position)

    def guard(self, commit: Callable[[], T], claims: Mapping[int, Claim], otherwise: T) -> T:
        """Run ``commit`` (fenced by ``claims``); when its fence did not hold, act on it
        and return ``otherwise``: a lost fence drops the partitions, a checkpoint already
        moved is taken. Any other error goes on, after marking the claims :attr:`stale`
        when its outcome is unknown."""
        try:
            return commit()
        except OwnershipLost as lost:
            self.lose(lost.partitions)
        except CheckpointMoved as moved:
            self._moved(moved, claims)
        except Exception as exc:
            if is_ambiguous(exc):
                self.stale = True
            raise
        return otherwise

    def retried(
        self,
        commit: Callable[[], T],
        claims: Mapping[int, Claim],
        what: str,
        retry: ConflictRetrySettings,
    ) -> T:
        """Run ``commit`` under ``retry`` (``conflict-retry``); before retrying after an
        error of unknown outcome, check that ``claims`` are still what the database holds
        (else :class:`CheckpointMoved` or :class:`OwnershipLost`, for :meth:`guard`)."""
        who = self._who
        try:
            return retry_transient(
                commit,
                retry,
                what=what,
                on_retry=partial(report_batch_retry, who.hooks, who.id, what, claims),
                reread=partial(self._reread, claims),
            )
        except Exception as exc:
            if is_ambiguous(exc):
                self.stale = True
            raise

    def lose(self, partitions: Sequence[int]) -> None:
        """Another instance owns ``partitions`` now: drop them, say so, tell the plugins."""
        name, who = self._spec.name, self._who
        lifecycle_event(  # one line for the batch's partitions
            "lost",
            level=logging.WARNING,
            consumer=name,
            partitions=",".join(map(str, sorted(partitions))),
            instance=who.name,
            instance_id=who.id,
            reason="another instance owns it now; the batch was rolled back",
        )
        self.drop(partitions)
        for partition in partitions:
            who.hooks.projections_partition_released(
                consumer=name, partition=partition, instance_id=who.id
            )

    def _moved(self, moved: CheckpointMoved, claims: Mapping[int, Claim]) -> None:
        """Take the checkpoints an unacknowledged earlier commit under ``claims`` wrote: go
        on from there (unless the partition was claimed again meanwhile)."""
        lifecycle_event(
            "checkpoint-moved",
            level=logging.WARNING,
            consumer=self._spec.name,
            checkpoints=moved.checkpoints,
            instance=self._who.name,
            instance_id=self._who.id,
            reason="an earlier commit went through unacknowledged; the batch was rolled back",
        )
        with self._holdings.lock:
            held = self._holdings.claims
            for partition, checkpoint in moved.checkpoints.items():
                current = held.get(partition)
                if current is not None and current.epoch == claims[partition].epoch:
                    held[partition] = attrs.evolve(current, checkpoint=checkpoint)
        if self._parking is not None:  # the earlier commit may have parked sources
            self._parking.reload(moved.checkpoints)

    def _reread(self, claims: Mapping[int, Claim], _error: BaseException) -> None:
        """Before retrying a commit of unknown outcome: raise :class:`CheckpointMoved` (or
        :class:`OwnershipLost`) unless ``claims`` are still what the database holds."""
        self.stale = True
        with self._db.read() as conn:
            self.ownership.verify(conn, self._spec.name, self._who.id, claims)

    def settle(self) -> None:
        """After an error of unknown outcome (:attr:`stale`): take every idle claim's epoch
        and checkpoint from the database; drop the partitions no longer held under the
        same epoch. Nothing to do otherwise."""
        if not self.stale:
            return
        claims = self._holdings.idle()  # a lane's batch in flight settles its own claims
        with self._db.read() as conn:
            held = self.ownership.owned(conn, self._spec.name, self._who.id, claims)
            if self._parking is not None:  # a park may have committed unacknowledged
                self._parking.load(conn, held)
        lost = [p for p, c in claims.items() if p not in held or held[p].epoch != c.epoch]
        with self._holdings.lock:
            for partition, claim in held.items():
                current = self._holdings.claims.get(partition)
                if current is not None and current.epoch == claim.epoch:
                    self._holdings.claims[partition] = claim
        self.stale = False
        if lost:
            self.lose(lost)
