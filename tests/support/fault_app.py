"""An application for the lost-acknowledgement fault tests: every kind of consumer, each
leaving one database row per message it applies, so that anything applied twice,
reordered or lost shows in the rows.

- ``fault-seq`` and ``fault-seq-single``: projections of numbered messages (per source,
  seq 1, 2, 3…), the second run single-owner by the fault tests' config; each applied
  message is one row in ``fault_applied`` (in apply order: an auto-increment id). Every
  fifth message is also sent on to two route consumers (from ``fault-seq`` only).
- ``fault-jobs`` (idempotent) and ``fault-jobs-plain`` (not): one row per job handled
  in ``fault_effects``.
- ``fault-timers``: a saga whose timer schedules one deadline; delivering it sends one
  ``Fired`` message to ``fault-fired`` and adds a row to ``fault_effects``.
"""

from __future__ import annotations

import attrs
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert

from messaging import HandlerContext, handler, message, route_consumer
from projections import projection
from sagas import SagaContext, saga, start

TOPIC = "fault-seq"
TIMERS = "fault-timers"
FIRED = "fault-fired"
GUARDED = "fault-jobs"
PLAIN = "fault-jobs-plain"
PROJECTIONS = ("fault-seq", "fault-seq-single")

metadata = MetaData()
applied = Table(
    "fault_applied",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer", String(32), nullable=False),
    Column("source", String(64), nullable=False),
    Column("seq", Integer, nullable=False),
)
effects = Table(
    "fault_effects",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer", String(32), nullable=False),
    Column("job_id", String(64), nullable=False),
)


@message("test.fault.numbered")
@attrs.define(frozen=True)
class Numbered:
    source: str
    seq: int


@message("test.fault.job")
@attrs.define(frozen=True)
class Job:
    job_id: str


@message("test.fault.timer-set")
@attrs.define(frozen=True)
class TimerSet:
    timer_id: str
    due_at: float


@message("test.fault.timer-due")
@attrs.define(frozen=True)
class TimerDue:
    timer_id: str


@message("test.fault.fired")
@attrs.define(frozen=True)
class Fired:
    timer_id: str


def _record(ctx: HandlerContext, consumer: str, event: Numbered) -> None:
    ctx.execute(insert(applied), {"consumer": consumer, "source": event.source, "seq": event.seq})


@projection("fault-seq", topics=TOPIC, partitions=4, tables=[applied])
class Sequence:
    @handler
    def numbered(self, event: Numbered, ctx: HandlerContext) -> None:
        _record(ctx, "fault-seq", event)
        if event.seq % 5 == 0:
            job = Job(f"{event.source}:{event.seq}")
            ctx.send(GUARDED, job, key=event.source)
            ctx.send(PLAIN, job, key=event.source)


@projection("fault-seq-single", topics=TOPIC, partitions=4, tables=[applied])
class SingleSequence:
    @handler
    def numbered(self, event: Numbered, ctx: HandlerContext) -> None:
        if event.seq < 0:
            raise ValueError(f"poison: seq {event.seq}")
        _record(ctx, "fault-seq-single", event)


def _effect(ctx: HandlerContext, consumer: str, job_id: str) -> None:
    ctx.execute(insert(effects), {"consumer": consumer, "job_id": job_id})


@route_consumer(GUARDED, partitions=2, idempotent=True, tables=[effects])
class GuardedJobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        _effect(ctx, GUARDED, job.job_id)


@route_consumer(PLAIN, partitions=2, tables=[effects])
class PlainJobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        _effect(ctx, PLAIN, job.job_id)


@attrs.define
class Timer:
    fired: int = 0


@saga("fault-timers", topics=TIMERS, correlate_by="timer_id", state=Timer, partitions=4)
class Timers:
    @start
    def set(self, event: TimerSet, ctx: SagaContext) -> None:
        ctx.state = Timer()
        ctx.schedule(TimerDue(event.timer_id), at=event.due_at)

    @handler
    def due(self, event: TimerDue, ctx: SagaContext) -> None:
        ctx.state.fired += 1
        ctx.send(FIRED, Fired(ctx.key))
        ctx.execute(insert(effects), {"consumer": "fault-timers", "job_id": ctx.key})
        ctx.end()
