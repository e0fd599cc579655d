"""A saga for real-process parking tests: one instance per trip (the trip id is both the
correlation key and the messages' source). Each leg, and each of the two alarms (the
deadlines ``a1`` and ``a2`` a leg with ``alarm_at`` schedules), sends a ``Done`` to
``test-parked-done`` keyed by the trip, committed with it: their order per trip shows what
was handled, once each, in which order. A leg marked ``poison`` fails while the file named
by ``PARKED_SAGA_BROKEN`` exists (deleting it "fixes" the handler)."""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from messaging import handler, message
from sagas import SagaContext, saga, start


@message("test-parked-saga.leg")
@attrs.define(frozen=True)
class Leg:
    trip_id: str
    seq: int
    poison: bool = False
    alarm_at: float = 0.0


@message("test-parked-saga.alarm")
@attrs.define(frozen=True)
class Alarm:
    trip_id: str
    name: str


@message("test-parked-saga.done")
@attrs.define(frozen=True)
class Done:
    trip_id: str
    what: str


@attrs.define
class Trip:
    legs: int = 0


@saga("parked-trips", topics="trips", correlate_by="trip_id", state=Trip, partitions=4)
class Trips:
    @start
    def leg(self, leg: Leg, ctx: SagaContext) -> None:
        if leg.poison and Path(os.environ["PARKED_SAGA_BROKEN"]).exists():
            raise ValueError(f"leg {leg.seq} of {leg.trip_id} is poison")
        ctx.state = ctx.state or Trip()
        ctx.state.legs += 1
        if leg.alarm_at:
            ctx.schedule(Alarm(leg.trip_id, "a1"), at=leg.alarm_at, name="a1")
            ctx.schedule(Alarm(leg.trip_id, "a2"), at=leg.alarm_at + 0.2, name="a2")
        ctx.send("test-parked-done", Done(leg.trip_id, f"leg-{leg.seq}"), key=leg.trip_id)

    @handler
    def alarm(self, alarm: Alarm, ctx: SagaContext) -> None:
        ctx.send("test-parked-done", Done(alarm.trip_id, f"alarm-{alarm.name}"), key=ctx.key)
