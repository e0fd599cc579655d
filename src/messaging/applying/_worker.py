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
from typing import Any, ClassVar, TypeVar

import attrs
import pluggy
from sqlalchemy import Connection

from messaging._consumers import ConsumerSpec
from messaging._errors import ApplyTimedOut
from messaging._lifecycle import Identity
from messaging._messages import Envelope, MessageRegistry
from messaging._settings import ConsumerSettings
from messaging.applying._apply_timeout import Abandoned, ApplyDeadlines, Deadline
from messaging.applying._batch import Batch, split_lanes
from messaging.applying._context import HandlerContext
from messaging.applying._fence import Fence
from messaging.applying._holdings import Holdings
from messaging.applying._lanes import Lanes
from messaging.applying._parked_apply import ParkedApply, held_back
from messaging.applying._polling import Worker
from messaging.distribution._ownership import Claim
from messaging.failures._parking import Parking
from messaging.failures._poison import Poison, isolate
from messaging.failures._stops import Stops
from messaging.store._database import (
    Database,
    reads_unlocked,
    take_write_lock,
)
from messaging.store._refusals import refusal
from messaging.store._retry import (
    is_transient,
)
from messaging.store._rows import POSITION, StoredRow, partition_in
from messaging.versions._gate import VersionGate

log = logging.getLogger("messaging.runtime.worker")
T = TypeVar("T")


class ConsumerWorker(Worker):
    """Applies one transactional consumer's owned partitions, batch by batch.

    Whole when built: the instance's parts it shares (``limiter``, ``deadlines``,
    ``outage``), the consumer's options (``whole``, ``lanes``, ``apply_timeout``,
    ``parking``) and, for a version being built beside the live one, its ``gate`` and
    ``cutover_due``."""

    deferred_handlers: ClassVar[bool] = True
    """Whether on SQLite a batch's handlers run before it takes the write lock (see
    :meth:`_commit`); False for a kind whose dispatcher reads and writes as it goes."""

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
        apply_timeout: float | None = None,
        deadlines: ApplyDeadlines | None = None,
        parking: Parking | None = None,
        gate: VersionGate | None = None,
        cutover_due: Callable[[], object] | None = None,
        **loop: Any,
    ) -> None:
        super().__init__(
            db=db,
            spec=spec,
            instance_id=instance_id,
            settings=settings,
            hooks=hooks,
            registry=registry,
            **loop,
        )
        self.instance_name = instance_name  # as log lines show it (instance_id: unique)
        self.who = Identity(instance_id, instance_name, hooks)
        self.whole = whole
        """Single-owner mode: apply only while holding every partition (global order)."""
        self.lanes = 1 if whole else max(1, min(lanes, spec.partitions))
        """Batches applied at once, each of whole partitions (:func:`split_lanes`)."""
        self._lane_cap = None if spec.kind.rebuildable else settings.batch_size
        """Most messages a lane applies at once: ``batch-size`` for a kind whose effects
        reach beyond its tables (what a crash repeats); none for a projection, whose lane
        applies its whole share of a read (no row read twice)."""
        self._limiter = limiter if limiter is not None else nullcontext()
        self.apply_timeout = apply_timeout  # apply-timeout: seconds a batch may take
        self.deadlines = deadlines or ApplyDeadlines(f"instance {instance_name}")
        """Where a batch's apply deadline is watched (the instance's watchdog's)."""
        self.gate = gate  # a version being built: what the live one did
        self.cutover_due = cutover_due
        """Called after a poll of a version being built near its end (see :meth:`poll`)."""
        self.holdings = Holdings(spec.name)
        """The claims, the batches in flight, and the handovers waiting for them."""
        self.fence = Fence(db=db, spec=spec, who=self.who, holdings=self.holdings, parking=parking)
        """The claims as the fenced commits answer (one path for a lost fence)."""
        self.stops = Stops(db=db, store=self.store, spec=spec, who=self.who, drop=self.drop)
        """Halts and leaves partitions at a message (what each left one needs)."""
        self.parked = (
            None
            if parking is None
            else ParkedApply(
                spec=spec,
                store=self.store,
                dispatcher=self.dispatcher,
                who=self.who,
                parking=parking,
                fence=self.fence,
                stops=self.stops,
                commit=self._commit,
                applied=self._applied,
                contexts=self._context,
            )
        )
        """On ``on-failure: park-source``: parks and retries sources."""
        self._deferred = db.is_sqlite and self.deferred_handlers
        """Whether batches run their handlers before taking SQLite's write lock."""
        self._splits = self._deferred and spec.kind.rebuildable
        """Whether a batch may commit between two messages rather than hold the lock
        (:meth:`_commit_before`)."""
        self._catching_up = False
        self._lanes = Lanes(self.lanes)
        self._stop = threading.Event()  # the apply loop's, once it runs
        self._loop_thread: int | None = None
        """The thread running the apply loop (None: polled by hand)."""
        self.respawn: Callable[[Callable[[threading.Event], None]], None] | None = None
        """Runs an apply loop in a new thread of the instance (set by its units): the one
        that takes over from a loop abandoned in a hung handler (see :meth:`_abandoned`)."""

    @property
    def parking(self) -> Parking | None:
        """The parked sources held (``on-failure: park-source``), or None."""
        return None if self.parked is None else self.parked.parking

    # -- ownership, changed by the rebalance loop ----------------------------------------

    def add_claims(self, claims: Sequence[Claim]) -> None:
        """Start applying these newly claimed partitions (their parked sources read first)."""
        self.fence.add(claims)
        self.wake()  # new partitions may have messages the pulse never announced here

    def drop(self, partitions: Sequence[int]) -> None:
        """Stop applying these partitions (released or lost)."""
        self.fence.drop(partitions)

    def claims(self) -> dict[int, Claim]:
        """A snapshot of the partitions applied here."""
        return self.fence.claims()

    # -- applying ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        self._stop = stop
        self._loop_thread = threading.get_ident()
        try:
            self._loop(stop, self.poll)
        finally:
            self._lanes.shutdown()

    def held_claims(self) -> dict[int, Claim]:
        """The claims to apply now (read again from the database after an error of unknown
        outcome): none in single-owner mode until every partition is held, since a single
        owner applies in global position order."""
        self.fence.settle()
        claims = self.claims()
        if self.whole and len(claims) < self.spec.partitions:
            return {}
        return claims

    def _retry_commit(self, action: Callable[[], T], claims: Mapping[int, Claim], what: str) -> T:
        """Run the commit ``action`` under ``conflict-retry`` (:meth:`Fence.retried`)."""
        return self.fence.retried(action, claims, what, self.settings.conflict_retry)

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
        if self.parked is not None and self.parked.parking.retrying(self.claims()):
            return self._retry_parked(self.parked)
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

    def _retry_parked(self, parked: ParkedApply) -> int:
        """Apply the held messages of the parked sources an operator asked to retry, of the
        partitions no batch applies now; return how many were applied."""
        claims = self.holdings.take(self.held_claims())
        try:
            return parked.retry(claims)
        finally:
            self.holdings.finish(claims)

    def _apply_limited(self, batch: Batch, started: float) -> int:
        with self._limiter:
            return self._apply(batch, started)

    def _apply(self, batch: Batch, started: float) -> int:
        """Apply ``batch`` and commit its fenced checkpoints (:meth:`Batch.checkpoint`). A
        fence that did not hold applies nothing (:meth:`Fence.guard`)."""
        return self.fence.guard(partial(self._apply_or_stop, batch, started), batch.claims, 0)

    def _apply_or_stop(self, batch: Batch, started: float) -> int:
        """Commit ``batch``; when a message of it fails, find it (:meth:`_find`) and stop
        there (:meth:`_stop_at`). A batch that failed after committing its first messages
        (:class:`PartlyApplied`) goes on with its rest as a batch of its own. Returns how
        many messages were committed."""
        committed = 0
        rest: Batch | None = batch
        while rest is not None:
            batch, failed = rest, None
            parts = _Parts(batch, started)
            try:
                rows = self._retry_commit(
                    partial(self._commit, batch, False, parts),
                    batch.claims,
                    f"apply {self.spec.name}",
                )
            except Poison as poison:
                failed = poison
            except PartlyApplied as partly:  # its rest failed: as a batch of its own
                committed += parts.count
                rest = batch.rest(partly.rows)
                if partly.poison is None or rest is None:
                    continue  # (an error outside the handlers: the rest tries again)
                batch, failed = rest, partly.poison.within(rest.rows or ())
            else:
                committed += parts.count  # (the final part: rows)
            if failed is not None:  # (outside the handler: see _find)
                found = self._find(batch.claims, failed)
                if isinstance(found, Poison):
                    return committed + self._stop_at(batch, failed.batch, found, started)
                rows = found
            if not rows:
                break
            self._applied(batch, rows, started)
            committed += len(rows)
            rest = batch.rest(rows)
        self._catching_up = committed >= self.settings.batch_size
        return committed

    def _find(self, claims: Mapping[int, Claim], failed: Poison) -> Sequence[StoredRow] | Poison:
        """The message of ``failed``'s batch that fails: the buffered writes hide which one,
        so the batch is applied again unbuffered (outside the first failure's handler, so
        that the error logged with the halt does not carry that failure as its context); a
        timeout names its own. Returns the rows committed should the batch pass this time."""
        if failed.exact and isinstance(failed.error, ApplyTimedOut):
            return failed
        try:
            return self._commit(Batch(claims, failed.batch), True)
        except Poison as poison:
            return poison

    def _stop_at(
        self, batch: Batch, replay: Sequence[StoredRow], poison: Poison, started: float
    ) -> int:
        """After ``poison`` failed the ``replay`` of ``batch``: park its source (``on-failure:
        park-source``), or commit what came before it and stop its partition right before
        it (:meth:`Stops.stop_before`). Returns how many messages were committed."""
        if self.parked is not None:
            done = self.parked.park_sources(batch, replay, poison, started)
            if done is not None:
                return done
        found = isolate(poison, partial(self._commit_prefix, batch.claims, started))
        self.stops.stop_before(found.poison, batch.claims)
        return found.committed

    def _commit_prefix(
        self, claims: Mapping[int, Claim], started: float, rows: Sequence[StoredRow]
    ) -> None:
        """Commit ``rows``, the messages before a poison message (see :func:`isolate`)."""
        prefix = Batch(claims, rows)
        self._commit(prefix, False)
        self._applied(prefix, rows, started)

    def _applied(self, batch: Batch, rows: Sequence[StoredRow], started: float) -> None:
        """After ``rows`` of ``batch`` committed: move the local checkpoints, tell the plugins."""
        claims = batch.claims
        self.fence.advance(claims, batch.checkpoint(rows))
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
            # one lane: a poison message's partition is looked up; a gate needs them all,
            # and so does a batch taken over past its apply timeout (its partitions split)
            hashes=self.lanes > 1 or self.gate is not None or self.apply_timeout is not None,
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

    def _context(
        self,
        conn: Connection,
        rows: Sequence[StoredRow],
        immediate: bool,
        loaded: dict[int, Envelope] | None = None,
    ) -> HandlerContext:
        """The context the handlers of ``rows`` run in (``immediate``: unbuffered writes),
        their envelopes loaded into ``loaded`` (and those found there not loaded again: a
        split batch's rest)."""
        cache: dict[int, Envelope] = {} if loaded is None else loaded

        def envelopes() -> dict[int, Envelope]:
            missing = [row[POSITION] for row in rows if row[POSITION] not in cache]
            if missing:
                cache.update(self.store.envelopes(conn, missing))
            return cache

        return HandlerContext(
            conn,
            envelopes,
            immediate=immediate,
            outbox=self.outbox,
            quiet=None if self.gate is None else self.gate.quiet,
        )

    def _commit(
        self, batch: Batch, immediate: bool, parts: _Parts | None = None
    ) -> Sequence[StoredRow]:
        """In one transaction: read the rows unless the batch has them, apply them, commit
        the fenced checkpoints (:meth:`Batch.checkpoint`). Returns the rows applied (by
        its last commit: see ``parts``).

        On SQLite the handlers run without the write lock (a deferred transaction), which
        their first write sent takes (:func:`take_write_lock`): the buffered writes at the
        batch's end, or earlier for a handler that writes through ``ctx.connection``, or
        that reads through it what an earlier message of the batch wrote. With ``parts``
        (a projection's batch) the latter commits the messages before its own first
        (:meth:`_commit_before`, each such part reported to ``parts`` as it commits) and
        the batch goes on in a new deferred transaction; a failure after such a commit
        raises :class:`PartlyApplied`. A write through
        ``ctx.connection`` refused for lack of the lock makes this consumer's batches
        take it from their start from then on (:meth:`_locks_at_start`)."""
        deferred = self._deferred and not immediate
        with self.db.transaction(consumer=self.spec.name, deferred=deferred) as conn:
            try:
                return self._apply_in(conn, batch, immediate, parts if deferred else None)
            except Exception as exc:
                if deferred and reads_unlocked(conn) and is_transient(exc):
                    self._locks_at_start(exc)
                raise

    def _apply_in(
        self, conn: Connection, batch: Batch, immediate: bool, parts: _Parts | None
    ) -> Sequence[StoredRow]:
        """:meth:`_commit`'s transaction ``conn``."""
        rows = self._fetch(conn, batch.claims) if batch.rows is None else batch.rows
        if not rows:
            return rows
        ctx = self._context(conn, rows, immediate, batch.envelopes)
        parked = self.parked
        held = None if parked is None else parked.parking.held(batch.claims, batch.parks)
        if held and parked is not None:
            rows = parked.with_sources(conn, rows)
        left = _Applying(batch.claims, rows)
        if parts is not None and self._splits and not held and not batch.parks:
            ctx.commit_before = partial(self._commit_before, conn, ctx, left, parts)
        abandon = partial(self._abandoned, left, ctx)
        timeout, name = self.apply_timeout, self.spec.name
        try:
            with self.deadlines.bound(conn, timeout, name, batch.claims, abandon) as deadline:
                ctx.deadline = deadline
                try:
                    todo = held_back(rows, held) if held else rows
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
                    raise poison.within(left.rows) from poison.error
        except Abandoned:
            raise
        except Exception as exc:
            if left.committed:  # the rest goes on in a batch of its own
                failed = exc if isinstance(exc, Poison) else None
                raise PartlyApplied(rows[: left.committed], failed) from exc
            raise
        take_write_lock(conn)
        if batch.parks and self.parking is not None:
            self.parking.write(conn, batch.parks)
        self.fence.commit(conn, left.claims, batch.checkpoint(left.rows))
        return left.rows

    def _commit_before(
        self, conn: Connection, ctx: HandlerContext, left: _Applying, parts: _Parts, position: int
    ) -> None:
        """Within a handler's read of ``ctx.connection`` (SQLite, a projection's batch):
        commit the writes of the messages ``left`` to apply before ``position`` with their
        fenced checkpoints, and go on in a new deferred transaction: the read sees them,
        and the write lock is held only while they are sent and committed."""
        ctx.deadline.check(position)  # (a handler that outlasted it: fails, not committed)
        index = [row[POSITION] for row in left.rows].index(position)
        at: int = left.rows[index - 1][POSITION]
        ctx.flush()  # takes the write lock
        self.fence.commit(conn, left.claims, at)
        self.db.commit_and_read_on(conn)
        self._applied(parts.batch, left.rows[:index], parts.started)
        parts.count += index
        left.claims = {p: attrs.evolve(c, checkpoint=at) for p, c in left.claims.items()}
        left.rows = left.rows[index:]
        left.committed += index

    def _locks_at_start(self, error: Exception) -> None:
        """A write of a handler (or of this kind's dispatcher) through ``ctx.connection``
        was refused, on SQLite, while its batch read without the write lock: from now on
        this consumer's batches take it at their start, as before."""
        self._deferred = self._splits = False
        log.warning(
            "consumer %s writes through ctx.connection before its batch's end (%s): its "
            "batches on SQLite now take the write lock from their first handler on, so the "
            "application's writes wait for its handlers; write through ctx.execute or "
            "ctx.upsert to keep them out of the lock",
            self.spec.name,
            error,
        )

    # -- a batch abandoned past its apply timeout --------------------------------------

    def _abandoned(self, left: _Applying, ctx: HandlerContext, deadline: Deadline) -> None:
        """Called by the watchdog once the batch with ``left`` to apply is past its apply
        timeout: the message being handled (``ctx.position``) holds only its own
        partition. A new thread fails that message there (halted, or its source parked)
        and frees the batch's other partitions at once, to be applied again by another
        lane, or by itself as the apply loop from now on when the hung thread ran it. The
        hung thread commits nothing when (if ever) it returns (:class:`Abandoned`), and
        keeps the hung partition from being applied here until then."""
        claims, rows = left.claims, left.rows
        hung = next((row for row in rows if row[POSITION] == ctx.position), rows[-1])
        partition = partition_in(hung, self.spec.partitions)
        if partition is None:  # (rows read without their hashes: no apply timeout)
            return
        deadline.partitions = (partition,)
        self.holdings.abandon(deadline.thread, [partition])
        self._lanes.abandon(deadline.thread)
        own = [row for row in rows if partition_in(row, self.spec.partitions) == partition]
        poison = Poison(hung, partition, deadline.error(hung[POSITION]), own)
        takeover = partial(self._take_over, claims, poison)
        others = sorted(set(claims) - {partition})
        log.warning(
            "consumer %s: partition %d stops at position %d, whose handler outlasted the "
            "apply timeout in %s; %s applied again at once (instance %s)",
            self.spec.name,
            partition,
            hung[POSITION],
            deadline.where,
            _partitions_are(others),
            self.instance_name,
        )
        if deadline.thread != self._loop_thread:
            name = f"takeover:{self.spec.name}"
            threading.Thread(target=takeover, name=name, daemon=True).start()
        elif self.respawn is not None:
            self.respawn(partial(self._take_over_loop, takeover))
        else:
            loop = partial(self._take_over_loop, takeover, self._stop)
            threading.Thread(target=loop, name=f"apply:{self.spec.name}", daemon=True).start()

    def _take_over_loop(self, takeover: Callable[[], None], stop: threading.Event) -> None:
        """Take a batch over (:meth:`_take_over`), then run the apply loop in its place."""
        self._loop_thread = threading.get_ident()
        try:
            takeover()
        except Abandoned:
            return  # hung again, and taken over again
        self._loop(stop, self.poll)

    def _take_over(self, claims: Mapping[int, Claim], poison: Poison) -> None:
        """Free the abandoned batch's other partitions, then fail ``poison`` (the hung
        message) in its partition: the batch's messages of that partition before it are
        committed (with ``on-failure: park-source``, all but its source's), and it halts
        there or its source is parked."""
        partition = poison.partition
        assert partition is not None
        self.holdings.finish(set(claims) - {partition})
        self.wake()
        batch = Batch({partition: claims[partition]}, poison.batch)
        stop = partial(self._stop_at, batch, poison.batch, poison, time.perf_counter())
        try:
            self.fence.guard(stop, batch.claims, 0)
        except Abandoned:
            raise
        except Exception:
            log.exception(
                "consumer %s: could not stop partition %d at position %d after its apply "
                "timeout; it is applied here no more until the instance restarts",
                self.spec.name,
                partition,
                poison.row[POSITION],
            )


def _partitions_are(partitions: Sequence[int]) -> str:
    """``partitions`` as the subject of a sentence ("partitions 1,3 are")."""
    if not partitions:
        return "no other partition is"
    if len(partitions) == 1:
        return f"partition {partitions[0]} is"
    return f"partitions {','.join(map(str, partitions))} are"


@attrs.define
class _Applying:
    """What a batch's transaction has left to apply: its ``claims`` (their checkpoints as
    committed so far) and ``rows``, after the ``committed`` first rows of the batch that
    commits between messages committed (:meth:`ConsumerWorker._commit_before`)."""

    claims: Mapping[int, Claim]
    rows: Sequence[StoredRow]
    committed: int = 0


@attrs.define
class _Parts:
    """The parts of ``batch`` committed so far between two of its messages (on SQLite),
    each reported as it commits; ``started``: when the batch's poll began."""

    batch: Batch
    started: float
    count: int = 0
    """How many of its messages they committed."""


class PartlyApplied(Exception):
    """A batch failed after committing its first ``rows`` (between two messages, on
    SQLite): the rest is applied as a batch of its own."""

    def __init__(self, rows: Sequence[StoredRow], poison: Poison | None) -> None:
        super().__init__(f"{len(rows)} message(s) committed before the failure")
        self.rows = rows
        self.poison = poison
        """The failure, when a message of the rest failed (else the rest tries again)."""
