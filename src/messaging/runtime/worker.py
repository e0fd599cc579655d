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
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, TypeVar

import attrs
import pluggy
from sqlalchemy import Connection

from messaging.consumers import ConsumerSpec
from messaging.distribution.ownership import Claim, Ownership
from messaging.errors import CheckpointMoved, OwnershipLost
from messaging.messages import Envelope, MessageRegistry
from messaging.routing.outbox import Outbox
from messaging.runtime.context import HandlerContext
from messaging.runtime.failures import last_frames
from messaging.runtime.lifecycle import lifecycle_event
from messaging.runtime.outage import Outage
from messaging.runtime.retry import is_ambiguous, is_transient, report_retry, retry_transient
from messaging.settings import ConsumerSettings
from messaging.store.database import Database
from messaging.store.store import MessageStore

log = logging.getLogger("messaging.runtime.worker")
T = TypeVar("T")

Handler = tuple[Callable[[Any, int | None], Any], Callable[[Any, HandlerContext], Any]]
"""(decode, handle) of one message type."""
StoredRow = Any  # a row of MessageStore.read_batch(): (position, type, partition_hash, payload)


def _without_context(method: Callable[[Any], Any]) -> Callable[[Any, HandlerContext], Any]:
    def call(message: Any, _ctx: HandlerContext) -> Any:
        return method(message)

    return call


class Poison(Exception):
    """A message that cannot be decoded or handled: its partition halts at it."""

    def __init__(self, row: StoredRow, partition: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.row = row
        self.partition = partition
        self.error = error
        self.batch: Sequence[StoredRow] = ()
        """The batch the failing message was in, to replay unbuffered."""


class Dispatcher:
    """Decodes rows and calls the consumer's handler for each."""

    def __init__(self, spec: ConsumerSpec, registry: MessageRegistry, db: Database) -> None:
        self.spec = spec
        self.registry = registry
        self.db = db
        self.target = spec.cls()
        self.handlers: dict[str, Handler] = {}
        for cls, attribute in spec.handlers.items():
            name = registry.type_name(cls)
            method = getattr(self.target, attribute)
            if spec.handler_arity[cls] == 1:
                method = _without_context(method)
            self.handlers[name] = (registry.decoder(name), method)
        self.type_names = sorted(self.handlers)

    def apply(self, rows: Sequence[StoredRow], ctx: HandlerContext, partition_count: int) -> None:
        """Decode and handle ``rows`` in order; wrap the first failure in :class:`Poison`."""
        handlers = self.handlers
        row: StoredRow = None
        try:
            for row in rows:
                ctx.position = row[0]
                decode, call = handlers[row[1]]
                call(decode(row[3], row[0]), ctx)
        except Exception as exc:
            if is_transient(exc):
                raise
            raise Poison(row, row[2] % partition_count, exc) from exc


class _Worker:
    """What both workers share: the consumer, its dispatcher, and the polling loop."""

    dispatcher_class: type[Dispatcher] = Dispatcher
    """Decodes and handles a batch; kinds of consumers with more to do bring their own."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        instance_id: str,
        settings: ConsumerSettings,
        hooks: pluggy.HookRelay,
        registry: MessageRegistry,
    ) -> None:
        self.db = db
        self.spec = spec
        self.instance_id = instance_id
        self.settings = settings
        self.hooks = hooks
        self.store = MessageStore(db, registry)
        self.outbox = Outbox(self.store, spec.name)
        self.dispatcher = self.dispatcher_class(spec, registry, db)
        self.outage = Outage(f"consumer {spec.name}")
        """Logs an unreachable database once; the instance shares one among its workers."""

    def poll(self) -> int:
        """Apply one batch; return how many messages were applied."""
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        self._loop(stop, self.poll)

    def idle_wait(self) -> float:
        """Seconds to wait after a poll that applied nothing: ``idle-poll-interval``."""
        return self.settings.idle_poll_interval

    def _loop(self, stop: threading.Event, poll: Callable[[], int]) -> None:
        """Call ``poll`` until ``stop`` is set; wait ``idle-poll-interval`` after an empty
        poll and ``conflict-retry.max-delay`` after a failed one."""
        while not stop.is_set():
            try:
                applied = poll()
            except Exception as exc:
                if self.outage.failed(exc):
                    pass  # an unreachable database: logged once per outage
                elif is_transient(exc):  # a lock conflict, retries spent
                    log.warning(
                        "consumer %s: poll failed, retrying after a pause: %s", self.spec.name, exc
                    )
                else:
                    log.exception(
                        "consumer %s: poll failed; retrying after a pause", self.spec.name
                    )
                applied = 0
                stop.wait(self.settings.conflict_retry.max_delay)
            else:
                self.outage.succeeded()
            if applied == 0:
                stop.wait(self.idle_wait())


class ConsumerWorker(_Worker):
    """Applies one transactional consumer's owned partitions, batch by batch."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        instance_id: str,
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
        self.whole = whole
        """Single-owner mode: apply only while holding every partition (global order)."""
        self.lanes = 1 if whole else max(1, min(lanes, spec.partitions))
        """Parts of a batch applied at once: partition ``p`` belongs to lane ``p % lanes``."""
        self._limiter = limiter if limiter is not None else nullcontext()
        self.ownership = Ownership(db)
        self._claims: dict[int, Claim] = {}
        self._lock = threading.Lock()
        self._batch_in_flight = threading.Lock()
        self._catching_up = False
        self._stale = False
        """An error of unknown outcome happened: re-read the claims before applying more."""
        self._lane_pool: ThreadPoolExecutor | None = None
        """Applies the lanes after the first of each batch (the polling thread applies it)."""

    # -- ownership, changed by the rebalance loop ----------------------------------------

    def add_claims(self, claims: Sequence[Claim]) -> None:
        """Start applying these newly claimed partitions."""
        with self._lock:
            for claim in claims:
                self._claims[claim.partition] = claim

    def drop(self, partitions: Sequence[int]) -> None:
        """Stop applying these partitions (released or lost)."""
        with self._lock:
            for partition in partitions:
                self._claims.pop(partition, None)

    def claims(self) -> dict[int, Claim]:
        """A snapshot of the partitions applied here."""
        with self._lock:
            return dict(self._claims)

    def drop_after_batch(self, partitions: Sequence[int]) -> None:
        """Stop applying ``partitions`` once the batches in flight (if any) have committed."""
        with self._batch_in_flight:
            self.drop(partitions)

    # -- applying ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        try:
            self._loop(stop, self._poll_in_flight)
        finally:
            if self._lane_pool is not None:
                self._lane_pool.shutdown()
                self._lane_pool = None

    def _poll_in_flight(self) -> int:
        with self._batch_in_flight:  # a release waits for this batch to commit
            return self.poll()

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
        claims = self.claims()
        with self.db.read() as conn:
            held = self.ownership.owned(conn, self.spec.name, self.instance_id, claims)
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
                on_retry=partial(report_retry, self.hooks, self.instance_id, what),
                reread=partial(self._reread, claims),
            )
        except Exception as exc:
            if is_ambiguous(exc):
                self._stale = True
            raise

    def poll(self) -> int:
        """Fetch and apply one batch of the owned partitions; return how many messages were
        applied.

        One read serves every lane: with several lanes, it fetches up to ``batch-size``
        messages per lane and each lane's part is applied in parallel, in a transaction
        of its own. (A read per lane would scan past the other lanes' messages.)
        With one lane, while batches come back full (catching up), the next one is read
        inside the apply transaction; otherwise it is read first in a short read-only
        transaction, so an idle poller never takes the write lock. At most
        ``executor.max-workers`` batches of the instance are applied at once (the limiter).
        """
        claims = self.held_claims()
        if not claims:
            return 0
        started = time.perf_counter()
        rows: Sequence[StoredRow] | None = None
        if self.lanes > 1 or not self._catching_up:
            with self.db.read() as conn:
                rows = self._fetch(conn, claims, self.settings.batch_size * self.lanes)
            if not rows:
                return 0
        self._catching_up = False
        if self.lanes == 1:
            return self._apply_limited(claims, rows, started)
        return self._apply_lanes(claims, rows or (), started)

    def _apply_lanes(
        self, claims: Mapping[int, Claim], rows: Sequence[StoredRow], started: float
    ) -> int:
        """Apply ``rows`` split by lane, the lanes in parallel, each committing its
        checkpoints at the read's last position. The partitions of lanes without messages
        go with the first lane that has some, so that the next read starts after them too."""
        count = self.spec.partitions
        by_lane: dict[int, list[StoredRow]] = {}
        for row in rows:
            by_lane.setdefault(row[2] % count % self.lanes, []).append(row)
        first = min(by_lane)
        parts = [
            (
                {
                    p: c
                    for p, c in claims.items()
                    if p % self.lanes == lane or (lane == first and p % self.lanes not in by_lane)
                },
                lane_rows,
            )
            for lane, lane_rows in sorted(by_lane.items())
        ]
        if self._lane_pool is None:
            self._lane_pool = ThreadPoolExecutor(
                self.lanes - 1, thread_name_prefix=f"{threading.current_thread().name}/lane"
            )
        through = int(rows[-1][0])
        futures = [
            self._lane_pool.submit(self._apply_limited, lane_claims, lane_rows, started, through)
            for lane_claims, lane_rows in parts[1:]
        ]
        try:
            applied = self._apply_limited(*parts[0], started, through)
        finally:
            wait(futures)  # the batch is in flight until every lane has committed
        return applied + sum(future.result() for future in futures)

    def _apply_limited(
        self,
        claims: Mapping[int, Claim],
        rows: Sequence[StoredRow] | None,
        started: float,
        through: int = 0,
    ) -> int:
        with self._limiter:
            return self._apply(claims, rows, started, through)

    def _apply(
        self,
        claims: Mapping[int, Claim],
        rows: Sequence[StoredRow] | None,
        started: float,
        through: int = 0,
    ) -> int:
        """Apply ``rows`` (read in the transaction when None) and commit the checkpoints of
        ``claims`` at the last row, or at ``through`` when the read behind ``rows`` went that
        far (it holds every message of ``claims`` up to it). A lost fence drops its
        partitions; a checkpoint found already moved (an earlier commit went through
        unacknowledged) is taken from the database: either way nothing is applied."""
        try:
            return self._apply_or_halt(claims, rows, started, through)
        except OwnershipLost as lost:
            self._lose(lost.partitions)
        except CheckpointMoved as moved:
            self._moved(moved, claims)
        except Exception as exc:
            if is_ambiguous(exc):  # a poison replay, a prefix or a halt of unknown outcome
                self._stale = True
            raise
        return 0

    def _apply_or_halt(
        self,
        claims: Mapping[int, Claim],
        rows: Sequence[StoredRow] | None,
        started: float,
        through: int,
    ) -> int:
        try:
            rows = self._retry_commit(
                lambda: self._commit(rows, claims, immediate=False, through=through),
                claims,
                f"apply {self.spec.name}",
            )
        except Poison as failed:
            # The buffered writes hide which message failed: replay it unbuffered to find out.
            try:
                rows = self._commit(failed.batch, claims, immediate=True)
            except Poison as poison:
                # Commit what came before the poison message, so that its partition's
                # checkpoint stops right before it, then halt that partition there.
                index = self._commit_before(poison, claims, started)
                self._halt(poison, claims)
                return index
        if not rows:
            return 0
        self._applied(claims, rows, started, through)
        self._catching_up = len(rows) >= self.settings.batch_size
        return len(rows)

    def _commit_before(self, poison: Poison, claims: Mapping[int, Claim], started: float) -> int:
        """Commit the messages before ``poison``'s; return how many. Should those fail as a
        whole (a write at the end of the batch), the poison moves to the message the
        failure names, until a prefix commits or none is left."""
        while index := [row[0] for row in poison.batch].index(poison.row[0]):
            try:
                self._commit(poison.batch[:index], claims, immediate=False)
            except Poison as earlier:
                poison.row, poison.partition, poison.error = (
                    earlier.row,
                    earlier.partition,
                    earlier.error,
                )
                continue
            self._applied(claims, poison.batch[:index], started)
            return index
        return 0

    def _applied(
        self,
        claims: Mapping[int, Claim],
        rows: Sequence[StoredRow],
        started: float,
        through: int = 0,
    ) -> None:
        """After ``rows`` committed: move the local checkpoints and tell the plugins."""
        last = int(rows[-1][0])
        self._advance(claims, max(last, through))
        self.hooks.projections_batch_applied(
            consumer=self.spec.name,
            partitions=sorted(claims),
            epochs={p: c.epoch for p, c in claims.items()},
            instance_id=self.instance_id,
            count=len(rows),
            last_position=last,
            seconds=time.perf_counter() - started,
        )

    def _fetch(
        self, conn: Connection, claims: Mapping[int, Claim], limit: int | None = None
    ) -> Sequence[StoredRow]:
        return self.store.read_batch(
            conn,
            self.spec.topics,
            partitions={p: c.checkpoint for p, c in claims.items()},
            partition_count=self.spec.partitions,
            types=self.dispatcher.type_names,
            limit=limit or self.settings.batch_size,
        )

    def _commit(
        self,
        rows: Sequence[StoredRow] | None,
        claims: Mapping[int, Claim],
        *,
        immediate: bool,
        through: int = 0,
    ) -> Sequence[StoredRow]:
        """In one transaction: read the batch unless given, apply it, commit the fenced
        checkpoints (at its last row or ``through``, the further). Returns the rows applied."""
        with self.db.transaction(consumer=self.spec.name) as conn:
            batch = self._fetch(conn, claims) if rows is None else rows
            if not batch:
                return batch
            positions = [row[0] for row in batch]
            ctx = HandlerContext(
                conn,
                lambda: self.store.envelopes(conn, positions),
                immediate=immediate,
                outbox=self.outbox,
            )
            try:
                self.dispatcher.apply(batch, ctx, self.spec.partitions)
                try:
                    ctx.flush()
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    raise Poison(batch[-1], batch[-1][2] % self.spec.partitions, exc) from exc
            except Poison as poison:
                poison.batch = batch
                raise
            self.ownership.commit_checkpoint(
                conn, self.spec.name, self.instance_id, claims, max(int(batch[-1][0]), through)
            )
            return batch

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
            instance=self.instance_id,
            reason="an earlier commit went through unacknowledged; the batch was rolled back",
        )
        with self._lock:
            for partition, checkpoint in moved.checkpoints.items():
                current = self._claims.get(partition)
                if current is not None and current.epoch == claims[partition].epoch:
                    self._claims[partition] = attrs.evolve(current, checkpoint=checkpoint)
        self._catching_up = False

    def _lose(self, partitions: Sequence[int]) -> None:
        for partition in partitions:
            lifecycle_event(
                "lost",
                level=logging.WARNING,
                consumer=self.spec.name,
                partition=partition,
                instance=self.instance_id,
                reason="another instance owns it now; the batch was rolled back",
            )
        self.drop(partitions)
        for partition in partitions:
            self.hooks.projections_partition_released(
                consumer=self.spec.name, partition=partition, instance_id=self.instance_id
            )

    def _halt(self, poison: Poison, claims: Mapping[int, Claim]) -> None:
        row, partition, error = poison.row, poison.partition, poison.error
        position, type_name = int(row[0]), str(row[1])
        self.hooks.projections_message_failed(
            consumer=self.spec.name,
            partition=partition,
            position=position,
            type_name=type_name,
            error=error,
            instance_id=self.instance_id,
        )
        detail = "".join(traceback.format_exception_only(error)).strip()
        with self.db.transaction() as conn:
            halted = self.ownership.halt(
                conn,
                self.spec.name,
                claims[partition],
                self.instance_id,
                position=position,
                type_name=type_name,
                error=detail,
                trace=last_frames(error),
            )
        self.drop([partition])
        if halted:
            lifecycle_event(
                "halt",
                level=logging.ERROR,
                exc_info=error,
                consumer=self.spec.name,
                partition=partition,
                instance=self.instance_id,
                epoch=claims[partition].epoch,
                position=position,
                type=type_name,
                error=detail,
            )
            self.hooks.projections_partition_halted(
                consumer=self.spec.name,
                partition=partition,
                position=position,
                type_name=type_name,
                error=detail,
                instance_id=self.instance_id,
            )


class InMemoryWorker(_Worker):
    """Applies an in-memory consumer whole, from the start of its topics, in this process."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        instance_id: str,
        settings: ConsumerSettings,
        hooks: pluggy.HookRelay,
        registry: MessageRegistry,
    ) -> None:
        super().__init__(
            db=db,
            spec=spec,
            instance_id=instance_id,
            settings=settings,
            hooks=hooks,
            registry=registry,
        )
        self.position = 0
        self.halted: str | None = None
        self.trace: str | None = None
        """Where the handler failed (the last frames of its traceback), while halted."""
        self.halted_message: dict[str, Any] | None = None
        """The poison message's position, type and error, while halted."""

    @property
    def target(self) -> Any:
        """The consumer object holding the in-memory state."""
        return self.dispatcher.target

    def poll(self) -> int:
        """Apply the next batch to the in-memory state; return how many were applied."""
        if self.halted is not None:
            return 0
        with self.db.read() as conn:
            rows = self.store.read_batch(
                conn,
                self.spec.topics,
                after=self.position,
                types=self.dispatcher.type_names,
                limit=self.settings.batch_size,
            )
        if not rows:
            return 0

        def load_envelopes() -> dict[int, Envelope]:
            with self.db.read() as conn:
                return self.store.envelopes(conn, [row[0] for row in rows])

        ctx = HandlerContext(None, load_envelopes)
        for index, row in enumerate(rows):
            try:
                self.dispatcher.apply(rows[index : index + 1], ctx, self.spec.partitions)
            except Poison as poison:
                self._halt(poison)
                return index
            self.position = int(row[0])
        return len(rows)

    def _halt(self, poison: Poison) -> None:
        position, type_name = int(poison.row[0]), str(poison.row[1])
        detail = "".join(traceback.format_exception_only(poison.error)).strip()
        self.halted = f"halted at position {position} ({type_name}): {detail}"
        self.trace = last_frames(poison.error)
        self.halted_message = {"position": position, "type": type_name, "error": detail}
        log.error("in-memory consumer %s %s", self.spec.name, self.halted, exc_info=poison.error)
        self.hooks.projections_message_failed(
            consumer=self.spec.name,
            partition=poison.partition,
            position=position,
            type_name=type_name,
            error=poison.error,
            instance_id=self.instance_id,
        )
