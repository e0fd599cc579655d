"""Applying a saga: its messages in batches, and its due deadlines, each in one fenced
transaction with the saga states they change.

A deadline belongs to the partition its saga key hashes to. Only the owner of that
partition delivers it, inside a transaction that deletes the deadline row, applies the
saga's handler and commits under the partition's fence (owner and epoch): a crash
before the commit leaves the deadline for the next owner, a zombie cannot commit, so
every deadline is delivered exactly once. Deadlines due while no instance ran are due
at the first poll after a claim.

A deadline never overtakes a message of its partition recorded before it fell due. A
message is recorded when its position is assigned: at the database's time read under
the tenant's position counter lock, which its transaction holds until it commits, so
later positions never have earlier times. The delivery transaction reads the first
message of the held partitions after their checkpoints (:meth:`MessageStore.first_after`)
and delivers only deadlines due before that message was recorded; the topics are read
again at once. What it reads is complete up to its time: on SQLite it holds the only
write lock, so no append is in flight; on MySQL it begins after a locking read of the
counter (:meth:`MessageStore.settled_time`) and delivers only deadlines due by then. The
checkpoints it reads behind are fenced by its commit. A deadline whose delivery fails
halts its partition, as a poison message does; one (or a saga state) newer than this
code leaves its partition to an instance that can read it
(``messaging.distribution._needs``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar

import attrs
from sqlalchemy import Connection

from messaging import Envelope, HandlerContext, ProjectionsError, UnknownPayloadVersion
from messaging.kinds import Claim, ConsumerWorker, Poison, StoredRow, clear_deadline, is_transient
from sagas._dispatch import SagaDispatcher
from sagas._rows import Deadline, deadline_id

T = TypeVar("T")
_PARTITION = attrgetter("partition")


def _no_envelopes() -> dict[int, Envelope]:
    raise ProjectionsError("a deadline being delivered has no envelope")


class SagaWorker(ConsumerWorker):
    """Applies a saga's owned partitions: their messages, then their due deadlines."""

    dispatcher_class = SagaDispatcher
    dispatcher: SagaDispatcher
    timed = True  # deadlines fall due with time: polled every idle-poll-interval

    def __init__(self, **options: Any) -> None:
        # One lane: a batch is applied in position order in one transaction, so messages of
        # one saga instance that reach one instance are applied in the order they were
        # recorded (lanes would apply them in parallel, in any order).
        super().__init__(**{**options, "lanes": 1})
        self._wake_at: float | None = None
        """When the next deadline falls due (monotonic), if before the next idle poll."""
        self._more_due = False
        """Whether the last delivery was a full batch (so more are likely due)."""
        self._topic_news = True
        """Whether the saga's topics may hold messages not read yet (see :meth:`_poll_topics`)."""
        self._topic_read_by = 0.0
        """When (monotonic) the topics are read whatever the pulse says: a safety net."""
        self._holding_back: int | None = None
        """The position of the unapplied message that last held deadlines back, if any."""

    def wake(self) -> None:
        """The pulse saw a topic's head move, partitions came, or the instance stops: read
        the topics at the next poll."""
        self._topic_news = True
        super().wake()

    def idle_wait(self) -> float:
        """Until the next deadline falls due, if that comes before ``idle-poll-interval``:
        so deadlines are delivered on time, not up to one poll interval late."""
        idle = self.settings.idle_poll_interval
        if self._wake_at is None:
            return idle
        return max(0.0, min(idle, self._wake_at - time.monotonic()))

    def poll(self) -> int:
        """Apply one batch of messages, then deliver the due deadlines of the same claims
        that no unapplied message recorded before them holds back (see the module)."""
        return self._poll_topics() + self.deliver_due()

    def _poll_topics(self) -> int:
        """Apply one batch of messages, unless under a pulse nothing new can be there: the
        last read of the topics found no row and no wake came since (the pulse wakes this
        worker when a head of its topics moves; claims coming wake it too), and
        ``stale-instance-timeout`` has not passed since that read (as long as a worker
        without deadlines waits for news). So a saga delivering deadlines, or idle for
        them, does not read its topics at every poll."""
        now = time.monotonic()
        if self.pulsed and not self._topic_news and now < self._topic_read_by:
            return 0
        self._topic_news = True  # kept unless this poll reads the topics and finds nothing
        self._topic_read_by = now + self.settings.stale_instance_timeout
        return super().poll()

    def _fetch(
        self, conn: Connection, claims: Mapping[int, Claim], limit: int | None = None
    ) -> Sequence[StoredRow]:
        self._topic_news = False  # before the read: a wake during it is kept
        rows = super()._fetch(conn, claims, limit)
        if rows:
            self._topic_news = True  # applied or not, read again next time
        return rows

    def deliver_due(self) -> int:
        """Deliver one batch of the deadlines of the held partitions due now, but those an
        unapplied message recorded before them holds back (see the module); return how
        many. A deadline whose delivery fails halts its partition, as a poison message
        does; the others are delivered. Those of a parked instance wait until it is
        retried."""
        self._wake_at = None
        claims = self.held_claims()
        if not claims:
            return 0
        dispatcher = self.dispatcher
        parked = () if self.parking is None else tuple(sorted(self.parking.held(claims)))
        more, self._more_due = self._more_due, False
        if not more:  # after a full batch, the delivery's own read tells
            with self.db.read() as conn:  # an idle poll never takes the write lock
                if not dispatcher.store.any_due(conn, sorted(claims), None, parked):
                    wait = dispatcher.store.next_due_in(
                        conn, sorted(claims), self.settings.idle_poll_interval, parked
                    )
                    self._wake_at = None if wait is None else time.monotonic() + wait
                    return 0
        with self._limiter:
            try:
                deliver = partial(self._retried, partial(self._deliver, claims, parked), claims)
                outcome = self.fence.guard(deliver, claims, None)  # None: the fence did not hold
            except Exception as exc:
                if is_transient(exc):
                    raise
                outcome = self._deliver_one_by_one(claims, parked)
            if outcome is None:
                return 0
            delivered, now = outcome
        self._more_due = len(delivered) >= self.settings.batch_size
        if delivered:
            self.hooks.projections_deadlines_delivered(
                consumer=self.spec.name,
                instance_id=self.instance_id,
                count=len(delivered),
                deadlines=list(map(deadline_id, delivered)),
                lateness=[max(0.0, now - d.due_at) for d in delivered],
            )
        return len(delivered)

    def _retried(self, action: Callable[[], T], claims: dict[int, Claim]) -> T:
        """A delivery retried after an error of unknown outcome reads the due deadlines
        again in its transaction: those the first attempt delivered are gone."""
        return self._retry_commit(action, claims, f"deliver deadlines of {self.spec.name}")

    def _deliver(
        self, claims: dict[int, Claim], parked: Sequence[str], only: Deadline | None = None
    ) -> tuple[list[Deadline], float]:
        """In one fenced transaction: read the due deadlines that no unapplied message holds
        back (:meth:`_due_by`) but the ``parked`` instances' (or just ``only``, if still
        among them), deliver them, commit."""
        dispatcher = self.dispatcher
        size = self.settings.batch_size
        settled = None if self.db.is_sqlite else self._settled_time()
        with self.db.transaction(consumer=self.spec.name) as conn:
            until = self._due_by(conn, claims, settled)
            due = dispatcher.store.due(conn, sorted(claims), size, until, parked)
            if only is not None:
                due = attrs.evolve(due, deadlines=[d for d in due.deadlines if d == only])
            if not due.deadlines:
                return [], 0.0
            ctx = HandlerContext(conn, _no_envelopes, outbox=self.outbox)
            dispatcher.deliver(due, ctx)
            ctx.flush()
            fenced = {p: claims[p] for p in set(map(_PARTITION, due.deadlines))}
            self.fence.commit(conn, fenced, 0)
            if self.needed.intersection(fenced):  # a deadline's record: delivered now
                clear_deadline(self.db, conn, self.spec.name, self.instance_id, fenced)
            return due.deadlines, due.now

    def _settled_time(self) -> float:
        """The database's time once no append is in flight (MySQL), in a short transaction
        of its own: every message recorded before it is visible to the delivery after."""
        with self.db.read() as conn:
            return self.store.settled_time(conn)

    def _due_by(
        self, conn: Connection, claims: Mapping[int, Claim], settled: float | None
    ) -> float | None:
        """The latest due time a deadline may have to be delivered now: before the first
        message of ``claims`` not applied yet was recorded, and by ``settled`` (the time
        up to which every recorded message is visible); None: no bound but now. An
        unapplied message found makes the next poll read the topics, at once the first
        time it holds deadlines back."""
        first = self.store.first_after(
            conn,
            self.spec.topics,
            partitions={p: c.checkpoint for p, c in claims.items()},
            partition_count=self.spec.partitions,
            types=self.dispatcher.type_names,
        )
        if first is None:
            self._holding_back = None
            return settled
        position, recorded = first
        self._topic_news = True
        if position != self._holding_back:  # not applied by the poll since: no hurry
            self._holding_back = position
            self._wake_at = time.monotonic()
        before = math.nextafter(recorded, -math.inf)  # recorded at the due time: it goes first
        return before if settled is None else min(settled, before)

    def _deliver_one_by_one(
        self, claims: dict[int, Claim], parked: Sequence[str]
    ) -> tuple[list[Deadline], float]:
        """After a failed batch: each due deadline in a transaction of its own (if still due
        and not held back then); the one that fails halts its partition at the
        partition's checkpoint, with the reason."""
        dispatcher = self.dispatcher
        with self.db.read() as conn:
            due = dispatcher.store.due(conn, sorted(claims), self.settings.batch_size, None, parked)
        delivered: list[Deadline] = []
        now = 0.0
        for deadline in due.deadlines:
            held = self.held_claims()
            if deadline.partition not in held:
                continue  # its partition halted (or moved) meanwhile
            try:
                deliver = partial(
                    self._retried, partial(self._deliver, held, parked, deadline), held
                )
                outcome = self.fence.guard(deliver, held, None)
            except UnknownPayloadVersion as newer:  # never decoded by guesswork: left
                what = f"deadline {deadline.name!r} of saga instance {deadline.key!r}"
                self.stops.leave(held[deadline.partition], newer, what)
                continue
            except Exception as exc:
                if is_transient(exc):
                    raise
                failure = ProjectionsError(
                    f"deadline {deadline.name!r} of saga instance {deadline.key!r}: {exc}"
                )
                claim = held[deadline.partition]
                row = (claim.checkpoint, deadline.type, deadline.partition, deadline.payload)
                self.stops.halt_at(Poison(row, deadline.partition, failure), held)
                continue
            if outcome is None:
                continue  # the fence did not hold
            done, now = outcome
            delivered.extend(done)
        return delivered, now
