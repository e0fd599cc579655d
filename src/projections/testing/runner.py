"""Running a :class:`~projections.testing.machine.ClusterMachine` as a test: the battery
first, then the random search, whose shrinking stops after a time budget."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import hypothesis
from hypothesis.internal.conjecture import engine
from hypothesis.reporting import current_reporter, with_reporter
from hypothesis.stateful import run_state_machine_as_test

from projections.testing.battery import run_battery
from projections.testing.machine import ClusterMachine, machine_settings

SHRINK_SECONDS = 30.0
"""How long the search shrinks a failure by default, at most; then it reports the
shortest failing run found so far (still a replayable program and cluster scenario)."""

_HYPOTHESIS_GIVES_UP = "WARNING: Hypothesis has spent more than five minutes"


@contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Within the block, Hypothesis stops shrinking a failure after ``seconds`` and reports
    the shortest failing example found so far, saying so in a line of its own."""
    if seconds <= 0:
        raise ValueError(f"shrink budget must be a positive number of seconds, got {seconds}")
    previous, outer = engine.MAX_SHRINKING_SECONDS, current_reporter()

    def reporter(value: object) -> None:
        if str(value).startswith(_HYPOTHESIS_GIVES_UP):
            value = (
                f"Shrinking stopped after the testing kit's budget of {seconds:g} s: the "
                "failing run below is the shortest found by then, not necessarily the "
                "shortest there is."
            )
        outer(value)

    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        with with_reporter(reporter):
            yield
    finally:
        engine.MAX_SHRINKING_SECONDS = previous


def run_cluster_machine(
    machine: type[ClusterMachine],
    settings: hypothesis.settings | None = None,
    database_url: str | None = None,
    *,
    shrink_seconds: float = SHRINK_SECONDS,
) -> None:
    """Run ``machine``'s battery, then the random search with ``settings`` (default
    :func:`machine_settings`) on ``database_url`` (default: the configured database),
    shrinking a failure for ``shrink_seconds`` at most."""
    run_battery(machine, database_url)
    with shrink_budget(shrink_seconds):
        run_state_machine_as_test(  # type: ignore[no-untyped-call]
            lambda: machine(database_url), settings=settings or machine_settings()
        )
