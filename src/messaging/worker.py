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
from typing import Any

import pluggy

from messaging.consumers import ConsumerSpec
from messaging.context import HandlerContext
from messaging.database import Database
from messaging.errors import OwnershipLost
from messaging.messages import MessageRegistry
from messaging.ownership import Claim, Ownership
from messaging.retry import is_transient, retry_transient
from messaging.settings import ConsumerSettings
from messaging.store import MessageStore

log = logging.getLogger("messaging.worker")

Handler = tuple[Callable[..., Any], int]
StoredRow = Any  # a row of MessageStore.read(), in MessageStore.row_columns() order


class _Poison(Exception):
    def __init__(self, row: StoredRow, partition: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.row = row
        self.partition = partition
        self.error = error


class _Dispatcher:
    """Decodes rows and calls the consumer's handler for each."""

    def __init__(self, spec: ConsumerSpec, registry: MessageRegistry) -> None:
        self.spec = spec
        self.registry = registry
        self.target = spec.cls()
        self.handlers: dict[str, Handler] = {
            registry.type_name(cls): (getattr(self.target, attribute), spec.handler_arity[cls])
            for cls, attribute in spec.handlers.items()
        }
        self.type_names = sorted(self.handlers)

    def apply(self, rows: Sequence[StoredRow], ctx: HandlerContext, partition_count: int) -> None:
        """Decode and handle ``rows`` in order; wrap the first failure in :class:`_Poison`."""
        decode = self.registry.decode
        handlers = self.handlers
        for row in rows:
            try:
                # The row becomes ctx.envelope; the Envelope itself is built only if asked for.
                ctx._row = row
                ctx._envelope = None
                type_name = row[4]
                body = decode(type_name, row[8], row[0])
                method, arity = handlers[type_name]
                if arity == 2:
                    method(body, ctx)
                else:
                    method(body)
            except Exception as exc:
                if is_transient(exc):
                    raise
                raise _Poison(row, row[5] % partition_count, exc) from exc


class ConsumerWorker:
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
    ) -> None:
        self.db = db
        self.spec = spec
        self.instance_id = instance_id
        self.settings = settings
        self.hooks = hooks
        self.store = MessageStore(db, registry)
        self.ownership = Ownership(db)
        self.dispatcher = _Dispatcher(spec, registry)
        self._claims: dict[int, Claim] = {}
        self._lock = threading.Lock()
        self._batch_in_flight = threading.Lock()

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
        """Stop applying ``partitions`` once the batch in flight (if any) has committed."""
        with self._batch_in_flight:
            self.drop(partitions)

    # -- applying ------------------------------------------------------------------------

    def poll(self) -> int:
        """Fetch and apply one batch; return how many messages were applied."""
        claims = self.claims()
        if not claims:
            return 0
        spec = self.spec
        with self.db.read() as conn:
            rows = self.store.read(
                conn,
                spec.topics,
                partitions={p: c.checkpoint for p, c in claims.items()},
                partition_count=spec.partitions,
                types=self.dispatcher.type_names,
                limit=self.settings.batch_size,
            )
        if not rows:
            return 0
        started = time.perf_counter()
        try:
            retry_transient(
                lambda: self._commit(rows, claims, immediate=False),
                self.settings.conflict_retry,
                what=f"apply {spec.name}",
                on_retry=lambda exc: self.hooks.projections_retrying(
                    what=f"apply {spec.name}", error=exc
                ),
            )
        except OwnershipLost as lost:
            self._lose(lost.partitions)
            return 0
        except _Poison:
            # The buffered writes hide which message failed: replay it unbuffered to find out.
            try:
                self._commit(rows, claims, immediate=True)
            except _Poison as poison:
                self._halt(poison, claims)
                return 0
            except OwnershipLost as lost:
                self._lose(lost.partitions)
                return 0
        last = int(rows[-1][0])
        self._advance(claims, last)
        self.hooks.projections_batch_applied(
            consumer=spec.name,
            partitions=sorted(claims),
            count=len(rows),
            last_position=last,
            seconds=time.perf_counter() - started,
        )
        return len(rows)

    def _commit(
        self, rows: Sequence[StoredRow], claims: Mapping[int, Claim], *, immediate: bool
    ) -> None:
        with self.db.transaction() as conn:
            ctx = HandlerContext(conn, immediate=immediate)
            self.dispatcher.apply(rows, ctx, self.spec.partitions)
            try:
                ctx.flush()
            except Exception as exc:
                if is_transient(exc):
                    raise
                raise _Poison(rows[-1], rows[-1][5] % self.spec.partitions, exc) from exc
            self.ownership.commit_checkpoint(
                conn,
                self.spec.name,
                self.instance_id,
                {p: c.epoch for p, c in claims.items()},
                int(rows[-1][0]),
            )

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

    def _lose(self, partitions: Sequence[int]) -> None:
        log.warning(
            "consumer %s: ownership of partitions %s lost on instance %s; rolled back",
            self.spec.name,
            list(partitions),
            self.instance_id,
        )
        self.drop(partitions)
        for partition in partitions:
            self.hooks.projections_partition_released(
                consumer=self.spec.name, partition=partition, instance_id=self.instance_id
            )

    def _halt(self, poison: _Poison, claims: Mapping[int, Claim]) -> None:
        row, partition, error = poison.row, poison.partition, poison.error
        position, type_name = int(row[0]), str(row[4])
        self.hooks.projections_message_failed(
            consumer=self.spec.name,
            partition=partition,
            position=position,
            type_name=type_name,
            error=error,
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
            )
        self.drop([partition])
        if halted:
            log.error(
                "consumer %s: partition %d halted at position %d (%s): %s",
                self.spec.name,
                partition,
                position,
                type_name,
                detail,
            )
            self.hooks.projections_partition_halted(
                consumer=self.spec.name,
                partition=partition,
                position=position,
                type_name=type_name,
                error=detail,
            )

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; wait ``idle-poll-interval`` after an empty poll."""
        idle = self.settings.idle_poll_interval
        while not stop.is_set():
            try:
                with self._batch_in_flight:
                    applied = self.poll()
            except Exception:
                log.exception("consumer %s: poll failed; retrying after a pause", self.spec.name)
                applied = 0
                stop.wait(self.settings.conflict_retry.max_delay)
            if applied == 0:
                stop.wait(idle)


class InMemoryWorker:
    """Applies an in-memory consumer whole, from the start of its topics, in this process."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        settings: ConsumerSettings,
        hooks: pluggy.HookRelay,
        registry: MessageRegistry,
    ) -> None:
        self.db = db
        self.spec = spec
        self.settings = settings
        self.hooks = hooks
        self.store = MessageStore(db, registry)
        self.dispatcher = _Dispatcher(spec, registry)
        self.position = 0
        self.halted: str | None = None

    @property
    def target(self) -> Any:
        """The consumer object holding the in-memory state."""
        return self.dispatcher.target

    def poll(self) -> int:
        """Apply the next batch to the in-memory state; return how many were applied."""
        if self.halted is not None:
            return 0
        with self.db.read() as conn:
            rows = self.store.read(
                conn,
                self.spec.topics,
                after=self.position,
                types=self.dispatcher.type_names,
                limit=self.settings.batch_size,
            )
        if not rows:
            return 0
        ctx = HandlerContext(None)
        for index, row in enumerate(rows):
            try:
                self.dispatcher.apply(rows[index : index + 1], ctx, self.spec.partitions)
            except _Poison as poison:
                self._halt(poison)
                return index
            self.position = int(row[0])
        return len(rows)

    def _halt(self, poison: _Poison) -> None:
        position, type_name = int(poison.row[0]), str(poison.row[4])
        detail = "".join(traceback.format_exception_only(poison.error)).strip()
        self.halted = f"halted at position {position} ({type_name}): {detail}"
        log.error("in-memory consumer %s %s", self.spec.name, self.halted)
        self.hooks.projections_message_failed(
            consumer=self.spec.name,
            partition=poison.partition,
            position=position,
            type_name=type_name,
            error=poison.error,
        )

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        idle = self.settings.idle_poll_interval
        while not stop.is_set():
            try:
                applied = self.poll()
            except Exception:
                log.exception("in-memory consumer %s: poll failed", self.spec.name)
                applied = 0
            if applied == 0:
                stop.wait(idle)
