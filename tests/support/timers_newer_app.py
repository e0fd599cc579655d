"""The newer generation of :mod:`timers_app`: the deadline ``test-shape-timers.due`` is at
version 2 (it says why it fell due; an upcaster reads version 1). Same saga declaration,
so older and newer instances share it."""

from __future__ import annotations

from typing import Any

import attrs
from timers_shared import FIRED, TOPIC, Fired, Timer, TimerSet

from messaging import handler, message, upcaster
from sagas import SagaContext, saga, start


@message("test-shape-timers.due", version=2)
@attrs.define(frozen=True)
class Due:
    timer_id: str
    reason: str


@upcaster("test-shape-timers.due", 1)
def with_reason(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "reason": "version 1"}


@saga("test-shape-timers", topics=TOPIC, correlate_by="timer_id", state=Timer, partitions=4)
class Timers:
    @start
    def set(self, event: TimerSet, ctx: SagaContext) -> None:
        ctx.state = Timer()
        ctx.schedule(Due(event.timer_id, "version 2"), at=event.due_at)

    @handler
    def due(self, event: Due, ctx: SagaContext) -> None:
        ctx.send(FIRED, Fired(event.timer_id, event.reason))
        ctx.end()
