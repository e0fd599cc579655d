"""A saga whose deadline message changes shape, as the older instances of a rolling deploy
run it: its deadline ``test-shape-timers.due`` is at version 1 (:mod:`timers_newer_app`
is the newer generation, at version 2). Each delivery sends one ``Fired`` command, whose
count shows the deliveries. Not importable beside :mod:`timers_newer_app`: only
``projections run`` processes load them."""

from __future__ import annotations

import attrs
from timers_shared import FIRED, TOPIC, Fired, Timer, TimerSet

from messaging import handler, message
from sagas import SagaContext, saga, start


@message("test-shape-timers.due")
@attrs.define(frozen=True)
class Due:
    timer_id: str


@saga("test-shape-timers", topics=TOPIC, correlate_by="timer_id", state=Timer, partitions=4)
class Timers:
    @start
    def set(self, event: TimerSet, ctx: SagaContext) -> None:
        ctx.state = Timer()
        ctx.schedule(Due(event.timer_id), at=event.due_at)

    @handler
    def due(self, event: Due, ctx: SagaContext) -> None:
        ctx.send(FIRED, Fired(event.timer_id, "version 1"))
        ctx.end()
