"""A saga for real-process tests: every timer schedules one deadline, whose delivery sends
one ``Fired`` command (committed with the delivery, so its count shows deliveries)."""

from __future__ import annotations

import attrs

from messaging import handler, message
from sagas import SagaContext, saga, start


@message("test-deadline-app.timer-set")
@attrs.define(frozen=True)
class TimerSet:
    timer_id: str
    due_at: float


@message("test-deadline-app.timer-due")
@attrs.define(frozen=True)
class TimerDue:
    timer_id: str


@message("test-deadline-app.fired")
@attrs.define(frozen=True)
class Fired:
    timer_id: str


@attrs.define
class Timer:
    fired: int = 0


@saga("test-timers", topics="timers", correlate_by="timer_id", state=Timer, partitions=8)
class Timers:
    @start
    def set(self, event: TimerSet, ctx: SagaContext) -> None:
        ctx.state = Timer()
        ctx.schedule(TimerDue(event.timer_id), at=event.due_at)

    @handler
    def due(self, event: TimerDue, ctx: SagaContext) -> None:
        ctx.state.fired += 1
        ctx.send("test-fired", Fired(ctx.key))
        ctx.end()
