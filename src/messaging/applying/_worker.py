"""The apply loop of one consumer on one instance.

Each poll reads one batch of the owned partitions after their checkpoints (one query),
applies it, and commits the handlers' writes together with the fenced checkpoints in
one transaction. A lost fence rolls everything back and drops the partitions. A
message that cannot be decoded or handled halts its partition at that message, with
the position, type and error recorded; nothing is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, TypeVar

import attrs
import pluggy
from sqlalchemy import Connection

from messaging._consumers import ConsumerSpec
from messaging._errors import ApplyTimedOut, CheckpointMoved, OwnershipLost
from messaging._lifecycle import lifecycle_event
from messaging._messages import MessageRegistry
from messaging._settings import ConsumerSettings
from messaging.applying import _parked_apply as parked
from messaging.applying._apply_timeout import ApplyDeadlines, batch_name
from messaging.applying._batch import Batch, split_lanes
from messaging.applying._context import HandlerContext
from messaging.applying._holdings import Holdings
from messaging.applying._lanes import Lanes
from messaging.applying._polling import Worker
from messaging.distribution._ownership import Claim, Ownership
from messaging.failures._parking import Parking
from messaging.failures._poison import Poison
from messaging.failures._stops import stop_at
from messaging.store._database import Database
from messaging.store._refusals import refusal
from messaging.store._retry import (
    is_ambiguous,
    is_transient,
    report_batch_retry,
    retry_transient,
)
from messaging.store._rows import POSITION, StoredRow, partition_in
from messaging.versions._gate import VersionGate

log = logging.getLogger("messaging.runtime.worker")
T = TypeVar("T")


class ConsumerWorker(Worker):
    """Applies one transactional consumer's owned partitions, batch by batch."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        instance_id: str,
        instance_name: str,
        settings: ConsumerSettings,
        hooks: pluggy.HookRelay,
        registry: MessageRegistry,
        whole: bool = False,
        lanes: int = 1,
        limiter: AbstractContextManager[Any] | None = None,
    ) -> None:
        super().__init__(
            db=db,
            spec=spec,
            instance_id=instance_id,
            settings=settings,
            hooks=hooks,
            registry=registry,
        )
        self.instance_name = instance_name  # as log lines show it (instance_id: unique)
        self.whole = whole
        """Single-owner mode: apply only while holding every partition (global order)."""
        self.lanes = 1 if whole else max(1, min(lanes, spec.partitions))
        """Batches applied at once, each of whole partitions (:func:`split_lanes`)."""
        self._lane_cap = None if spec.kind.rebuildable else settings.batch_size
        """Most messages a lane applies at once: ``batch-size`` for a kind whose effects
        reach beyond its tables (what a crash repeats); none for a projection, whose lane
        applies its whole share of a read (no row read twice)."""
        self._limiter = limiter if limiter is not None else nullcontext()
        self.ownership = Ownership(db)
        self.holdings = Holdings(spec.name)
        """The claims, the batches in flight, and the handovers waiting for them."""
        self._claims, self._lock = self.holdings.claims, self.holdings.lock
        self._catching_up = self._stale = False  # _stale: an unknown outcome: re-read claims
        self._lanes = Lanes(self.lanes)
        self._stop = threading.Event()  # the apply loop's, once it runs
        self.gate: VersionGate | None = None  # a version being built: what the live one did
        self.cutover_due: Callable[[], object] | None = None
        """Called after a poll of a version being built near its end (see :meth:`poll`)."""
        self.parking: Parking | None = None  # on-failure: park-source: parked sources held
        self.apply_timeout: float | None = None  # apply-timeout: seconds a batch may take
        self.left: dict[int, tuple[tuple[str, int], float]] = {}
        """Partitions left for a newer declaration: what each needs, and when (monotonic).
        A rebalance round that read the rows before that does not claim them back."""
        self.said: set[tuple[int, str]] = set()  # the leaves logged: (partition, where)
        self.deadlines = ApplyDeadlines(f"instance {instance_name}")  # the watchdog's

    # -- ownership, changed by the rebalance loop ----------------------------------------

    def add_claims(self, claims: Sequence[Claim]) -> None:
        """Start applying these newly claimed partitions (their parked sources read first)."""
        if self.parking is not None:
            self.parking.reload([claim.partition for claim in claims])
        with self._lock:
            for claim in claims:
                self._claims[claim.partition] = claim
        self.wake()  # new partitions may have messages the pulse never announced here

    def drop(self, partitions: Sequence[int]) -> None:
        """Stop applying these partitions (released or lost)."""
        with self._lock:
            for partition in partitions:
                self._claims.pop(partition, None)
        if self.parking is not None:
            self.parking.forget(partitions)

    def claims(self) -> dict[int, Claim]:
        """A snapshot of the partitions applied here."""
        with self._lock:
            return dict(self._claims)

    # -- applying ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        self._stop = stop
        try:
            self._loop(stop, self.poll)
        finally:
            self._lanes.shutdown()

    def held_claims(self) -> dict[int, Claim]:
        """The claims to apply now: none in single-owner mode until every partition is
        held, since a single owner applies in global position order."""
        if self._stale:
            self._recheck()
        claims = self.claims()
        if self.whole and len(claims) < self.spec.partitions:
            return {}
        return claims

    def _recheck(self) -> None:
        """After an error of unknown outcome: take every claim's epoch and checkpoint from
        the database (our commit may have gone through unacknowledged); drop partitions no
        longer held under the same epoch."""
        claims = self.holdings.idle()  # a lane's batch in flight settles its own claims
        with self.db.read() as conn:
            held = self.ownership.owned(conn, self.spec.name, self.instance_id, claims)
            if self.parking is not None:  # a park may have committed unacknowledged
                self.parking.load(conn, held)
        lost = [p for p, c in claims.items() if p not in held or held[p].epoch != c.epoch]
        with self._lock:
            for partition, claim in held.items():
                current = self._claims.get(partition)
                if current is not None and current.epoch == claim.epoch:
                    self._claims[partition] = claim
        self._stale = False
        if lost:
            self._lose(lost)

    def _reread(self, claims: Mapping[int, Claim], _error: BaseException) -> None:
        """Before retrying a commit of unknown outcome: raise :class:`CheckpointMoved` (or
        :class:`OwnershipLost`) unless ``claims`` are still what the database holds. Every
        claim is re-read before the next batch too."""
        self._stale = True
        with self.db.read() as conn:
            self.ownership.verify(conn, self.spec.name, self.instance_id, claims)

    def _retry_commit(self, action: Callable[[], T], claims: Mapping[int, Claim], what: str) -> T:
        """Run the commit ``action`` under ``conflict-retry``; after an error of unknown
        outcome, re-read ``claims`` before retrying (:meth:`_reread`)."""
        try:
            return retry_transient(
                action,
                self.settings.conflict_retry,
                what=what,
                on_retry=partial(report_batch_retry, self.hooks, self.instance_id, what, claims),
                reread=partial(self._reread, claims),
            )
        except Exception as exc:
            if is_ambiguous(exc):
                self._stale = True
            raise

    def poll(self) -> int:
        """Fetch and apply one batch of the owned partitions; return how many messages were
        applied. A version being built that is within a batch of its live version, or whose
        live version stopped for the cutover, then asks for the next cutover step at once
        (:attr:`cutover_due`), not at the next rebalance round: the live version is applied
        by no one from the stop to the swap."""
        applied = self._poll()
        gate, due = self.gate, self.cutover_due
        if gate is not None and due is not None and gate.due(applied, self.settings.batch_size):
            due()  # within a batch of the live version, or it stopped
        return applied

    def _poll(self) -> int:
        """Fetch and apply one batch of the owned partitions; return how many messages were
        applied.

        With one lane, while batches come back full (catching up), the next one is read
        inside the apply transaction; otherwise it is read first in a short read-only
        transaction, so an idle poller never takes the write lock (several lanes:
        :meth:`_poll_lanes`). The instance applies ``executor.max-workers`` batches at most.
        """
        if self.parking is not None and self.parking.retrying(self.claims()):
            return parked.retry_held(self)
        if self.lanes > 1:
            return self._poll_lanes()
        claims = self.holdings.take(self.held_claims())
        try:
            if not claims:
                return 0
            started = time.perf_counter()
            rows: Sequence[StoredRow] | None = None
            if not self._catching_up:
                with self.db.read() as conn:
                    rows = self._fetch(conn, claims)
                if not rows:
                    return 0
            self._catching_up = False
            return self._apply_limited(Batch(claims, rows), started)
        finally:
            self.holdings.finish(claims)

    def _poll_lanes(self) -> int:
        """One read (``batch-size`` per free lane) of the partitions no batch applies, split
        among the free lanes (:func:`split_lanes`) and applied in parallel; returns what the
        batches that ended applied. A busy lane does not hold the others (:class:`Lanes`):
        the free lanes are read again meanwhile."""
        idle = self.settings.idle_poll_interval
        while True:
            claims = self.holdings.take(self.held_claims())
            free = min(self._lanes.free(), len(claims))
            started = time.perf_counter()
            rows: Sequence[StoredRow] = ()
            try:  # (the read's commit may fail after the rows came)
                if free:
                    with self.db.read() as conn:
                        rows = self._fetch(conn, claims, self.settings.batch_size * free)
            except BaseException:
                self.holdings.finish(claims)
                raise
            if not rows:
                self.holdings.finish(claims)
            for batch in split_lanes(claims, rows, self.spec.partitions, free, self._lane_cap):
                apply = partial(self._apply_limited, batch, started)
                self._lanes.submit(apply, partial(self.holdings.finish, batch.claims))
            if not self._lanes.running():
                return 0
            ended = self._lanes.wait(idle)
            if ended is not None or self._stop.is_set():
                return ended or 0

    def _apply_limited(self, batch: Batch, started: float) -> int:
        with self._limiter:
            return self._apply(batch, started)

    def _apply(self, batch: Batch, started: float) -> int:
        """Apply ``batch`` and commit its fenced checkpoints (:meth:`Batch.checkpoint`). A
        lost fence drops its partitions; a checkpoint found already moved (an earlier
        commit went through unacknowledged) is taken from the database: either way
        nothing is applied."""
        try:
            return self._apply_or_halt(batch, started)
        except OwnershipLost as lost:
            self._lose(lost.partitions)
        except CheckpointMoved as moved:
            self._moved(moved, batch.claims)
        except Exception as exc:
            if is_ambiguous(exc):  # a poison replay, a prefix or a halt of unknown outcome
                self._stale = True
            raise
        return 0

    def _apply_or_halt(self, batch: Batch, started: float) -> int:
        claims = batch.claims
        try:
            rows = self._retry_commit(
                lambda: self._commit(batch, immediate=False), claims, f"apply {self.spec.name}"
            )
        except Poison as failed:
            replay: Sequence[StoredRow] | None = failed.batch
            known = failed if failed.exact and isinstance(failed.error, ApplyTimedOut) else None
        else:
            replay = None
        if replay is not None:
            # The buffered writes hide which message failed: replay it unbuffered to find
            # out (outside the handler above, so the handler's error, logged with the halt,
            # does not carry this first failure as its context). A timeout names its own.
            try:
                if known is not None:
                    raise known
                rows = self._commit(Batch(claims, replay), immediate=True)
            except Poison as poison:
                return stop_at(self, batch, replay, poison, started)
        if not rows:
            return 0
        self._applied(batch, rows, started)
        self._catching_up = len(rows) >= self.settings.batch_size
        return len(rows)

    def _commit_prefix(
        self, claims: Mapping[int, Claim], started: float, rows: Sequence[StoredRow]
    ) -> None:
        """Commit ``rows``, the messages before a poison message (see :func:`isolate`)."""
        prefix = Batch(claims, rows)
        self._commit(prefix, immediate=False)
        self._applied(prefix, rows, started)

    def _applied(self, batch: Batch, rows: Sequence[StoredRow], started: float) -> None:
        """After ``rows`` of ``batch`` committed: move the local checkpoints, tell the plugins."""
        claims = batch.claims
        self._advance(claims, batch.checkpoint(rows))
        self.hooks.projections_batch_applied(
            consumer=self.spec.name,
            partitions=sorted(claims),
            epochs={p: c.epoch for p, c in claims.items()},
            instance_id=self.instance_id,
            count=len(rows),
            last_position=rows[-1][POSITION],
            seconds=time.perf_counter() - started,
        )

    def _fetch(
        self, conn: Connection, claims: Mapping[int, Claim], limit: int | None = None
    ) -> Sequence[StoredRow]:
        sources = self.parking is not None and bool(self.parking.held(claims))
        rows = self.store.read_batch(
            conn,
            self.spec.topics,
            partitions={p: c.checkpoint for p, c in claims.items()},
            partition_count=self.spec.partitions,
            types=self.dispatcher.type_names,
            limit=limit or self.settings.batch_size,
            # one lane: a poison message's partition is looked up; a gate needs them all
            hashes=self.lanes > 1 or self.gate is not None,
            sources=sources,  # only while a partition has parked sources
        )
        self.hooks.projections_batch_read(
            consumer=self.spec.name,
            instance_id=self.instance_id,
            partitions=list(claims),
            count=len(rows),
        )
        if self.gate is None:
            return rows
        self.gate.read(conn)
        return self.gate.cap(rows)

    def _commit(self, batch: Batch, *, immediate: bool) -> Sequence[StoredRow]:
        """In one transaction: read the rows unless the batch has them, apply them, commit
        the fenced checkpoints (:meth:`Batch.checkpoint`). Returns the rows applied."""
        claims = batch.claims
        with self.db.transaction(consumer=self.spec.name) as conn:
            rows = self._fetch(conn, claims) if batch.rows is None else batch.rows
            if not rows:
                return rows
            ctx = HandlerContext(
                conn,
                lambda: self.store.envelopes(conn, [row[POSITION] for row in rows]),
                immediate=immediate,
                outbox=self.outbox,
                quiet=None if self.gate is None else self.gate.quiet,
            )
            held = None if self.parking is None else self.parking.held(claims, batch.parks)
            if held:
                rows = parked.with_sources(self, conn, rows)
            with self.deadlines.bound(
                conn, self.apply_timeout, batch_name(self.spec.name, claims)
            ) as deadline:
                ctx.deadline = deadline
                try:
                    todo = parked.held_back(rows, held) if held else rows
                    self.dispatcher.apply(todo, ctx, self.spec.partitions)
                    try:
                        ctx.flush()
                        deadline.check(rows[-1][POSITION])
                    except Exception as exc:
                        last = rows[-1]
                        passed = deadline.passed()
                        if not passed and (is_transient(exc) or refusal(exc)):
                            raise
                        error = deadline.error(last[POSITION]) if passed else exc
                        partition = partition_in(last, self.spec.partitions)
                        raise Poison(last, partition, error, exact=False) from exc
                except Poison as poison:
                    raise poison.within(rows) from poison.error
            if batch.parks and self.parking is not None:
                self.parking.write(conn, batch.parks)
            self.ownership.commit_checkpoint(
                conn, self.spec.name, self.instance_id, claims, batch.checkpoint(rows)
            )
            return rows

    def _advance(self, applied: Mapping[int, Claim], position: int) -> None:
        with self._lock:
            for partition, claim in applied.items():
                current = self._claims.get(partition)
                if (
                    current is not None
                    and current.epoch == claim.epoch
                    and current.checkpoint < position
                ):
                    self._claims[partition] = Claim(
                        partition=partition, epoch=claim.epoch, checkpoint=position
                    )

    def _moved(self, moved: CheckpointMoved, claims: Mapping[int, Claim]) -> None:
        """Take the checkpoints an unacknowledged earlier commit under ``claims`` wrote: go
        on from there (unless the partition was claimed again meanwhile)."""
        lifecycle_event(
            "checkpoint-moved",
            level=logging.WARNING,
            consumer=self.spec.name,
            checkpoints=moved.checkpoints,
            instance=self.instance_name,
            instance_id=self.instance_id,
            reason="an earlier commit went through unacknowledged; the batch was rolled back",
        )
        with self._lock:
            for partition, checkpoint in moved.checkpoints.items():
                current = self._claims.get(partition)
                if current is not None and current.epoch == claims[partition].epoch:
                    self._claims[partition] = attrs.evolve(current, checkpoint=checkpoint)
        if self.parking is not None:  # the earlier commit may have parked sources
            self.parking.reload(moved.checkpoints)
        self._catching_up = False

    def _lose(self, partitions: Sequence[int]) -> None:
        lifecycle_event(  # one line for the batch's partitions
            "lost",
            level=logging.WARNING,
            consumer=self.spec.name,
            partitions=",".join(map(str, sorted(partitions))),
            instance=self.instance_name,
            instance_id=self.instance_id,
            reason="another instance owns it now; the batch was rolled back",
        )
        self.drop(partitions)
        for partition in partitions:
            self.hooks.projections_partition_released(
                consumer=self.spec.name, partition=partition, instance_id=self.instance_id
            )
