"""Running a :class:`~projections.testing.machine.ClusterMachine` as a test: the battery
first, then the random search, which reports a failure within a time budget,
shrinking included."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hypothesis
from hypothesis.internal.conjecture import engine
from hypothesis.reporting import current_reporter, with_reporter
from hypothesis.stateful import run_state_machine_as_test

from projections.testing.battery import BatteryMachine, run_battery
from projections.testing.testcase import MachineCase, machine_settings

REPORT_SECONDS = 30.0
"""By default the search reports a failure within this many seconds of its start: it
stops shrinking then (after at least :data:`LEAST_SHRINKING` seconds of it) and reports
the shortest failing run found so far, still a replayable program and cluster scenario."""

LEAST_SHRINKING = 5.0
"""Seconds of shrinking a failure always gets, however long finding it took."""

_HYPOTHESIS_GIVES_UP = "WARNING: Hypothesis has spent more than five minutes"
"""The start of the line Hypothesis reports when it stops shrinking at its time limit."""

SHRINK_LIMIT = "MAX_SHRINKING_SECONDS"
"""The Hypothesis internal the budget replaces: ``hypothesis.internal.conjecture.engine``'s
five-minute shrink cap, which the engine adds to ``time.perf_counter()`` when shrinking
starts (Hypothesis 6; ``tests/kit/test_shrink_budget.py`` fails loudly if it moves)."""


class _StopShrinkingAt:
    """Hypothesis adds its shrink-time limit to the time shrinking starts: this limit makes
    the sum the moment to stop, ``deadline`` (or ``LEAST_SHRINKING`` after the start)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __radd__(self, started: float) -> float:
        return max(self.deadline, started + LEAST_SHRINKING)


@contextmanager
def report_within(seconds: float) -> Iterator[None]:
    """Within the block, Hypothesis stops shrinking a failure ``seconds`` after the block
    began (or :data:`LEAST_SHRINKING` seconds after it began shrinking, whichever is later)
    and reports the shortest failing example found by then, saying so in a line."""
    if seconds <= 0:
        raise ValueError(f"report_within must be a positive number of seconds, got {seconds}")
    if not hasattr(engine, SHRINK_LIMIT):
        warnings.warn(
            f"projections.testing: hypothesis.internal.conjecture.engine.{SHRINK_LIMIT} is "
            f"gone in Hypothesis {hypothesis.__version__}: failures are shrunk without the "
            f"testing kit's {seconds:g} s budget",
            stacklevel=3,
        )
        yield
        return
    previous, outer = getattr(engine, SHRINK_LIMIT), current_reporter()

    def reporter(value: object) -> None:
        if str(value).startswith(_HYPOTHESIS_GIVES_UP):
            value = (
                f"Shrinking stopped to report within the testing kit's {seconds:g} s: the "
                "failing run below is the shortest found by then, not necessarily the "
                "shortest there is."
            )
        outer(value)

    setattr(engine, SHRINK_LIMIT, _StopShrinkingAt(time.perf_counter() + seconds))
    try:
        with with_reporter(reporter):
            yield
    finally:
        setattr(engine, SHRINK_LIMIT, previous)


def run_cluster_machine(
    machine: type[BatteryMachine],
    settings: hypothesis.settings | None = None,
    database_url: str | None = None,
    *,
    report_seconds: float = REPORT_SECONDS,
) -> None:
    """Run ``machine``'s battery, then the random search with ``settings`` (default
    :func:`machine_settings`) on ``database_url`` (default: the configured database),
    reporting a failure within ``report_seconds`` of the search's start, shrinking
    included."""
    run_battery(machine, database_url)
    with report_within(report_seconds):
        run_state_machine_as_test(  # type: ignore[no-untyped-call]
            lambda: machine(database_url), settings=settings or machine_settings()
        )


class TestCaseProperty:
    """``Machine.TestCase``: a unittest case of the machine that runs its battery first
    (one per machine class)."""

    def __init__(self) -> None:
        self._cases: dict[type, type[MachineCase]] = {}

    def __get__(self, obj: Any, owner: type[Any]) -> type[MachineCase]:
        # (``owner``: a ClusterMachine subclass, whatever the types of its own attributes)
        machine: type[BatteryMachine] = owner if obj is None else type(obj)
        if machine not in self._cases:
            self._cases[machine] = _test_case(machine)
        return self._cases[machine]


def _test_case(machine: type[BatteryMachine]) -> type[MachineCase]:
    class MachineTestCase(MachineCase):
        settings = machine_settings()

        def runTest(self) -> None:
            run_cluster_machine(machine, self.settings)

    MachineTestCase.__name__ = f"{machine.__name__}.TestCase"
    MachineTestCase.__qualname__ = f"{machine.__qualname__}.TestCase"
    return MachineTestCase
