"""What :mod:`timers_app` and :mod:`timers_newer_app` share: the topic, the message that
sets a timer and the command each delivery sends."""

from __future__ import annotations

import attrs

from messaging import message

TOPIC = "shape-timers"
FIRED = "shape-timers-fired"
"""The destination each delivered deadline sends a :class:`Fired` to."""


@message("test-shape-timers.set")
@attrs.define(frozen=True)
class TimerSet:
    timer_id: str
    due_at: float


@message("test-shape-timers.fired")
@attrs.define(frozen=True)
class Fired:
    timer_id: str
    reason: str


@attrs.define
class Timer:
    """A timer saga's state: nothing but its existence."""

    armed: bool = True
