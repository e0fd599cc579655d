"""The search's shrink budget (``report_within``) replaces an internal of Hypothesis 6: the
engine's five-minute shrink cap. These tests fail loudly, naming that internal, when a
Hypothesis release moves it; the kit then still runs, shrinking without its budget."""

from __future__ import annotations

import inspect
import time

import hypothesis
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine
from hypothesis.reporting import with_reporter

from projections.testing import report_within, runner

INTERNAL = f"hypothesis.internal.conjecture.engine.{runner.SHRINK_LIMIT}"
MOVED = (
    f"Hypothesis {hypothesis.__version__} changed {INTERNAL}, which the testing kit's "
    "shrink budget (projections.testing.runner.report_within) replaces: adapt the runner "
    "or pin hypothesis below this version in pyproject.toml"
)


def test_the_hypothesis_internal_is_where_the_budget_expects_it() -> None:
    source = inspect.getsource(engine)
    assert isinstance(getattr(engine, runner.SHRINK_LIMIT, None), int | float), MOVED
    assert f"time.perf_counter() + {runner.SHRINK_LIMIT}" in source, MOVED
    assert runner._HYPOTHESIS_GIVES_UP in source, MOVED


def _slow_to_shrink() -> None:
    """A failure found at once whose shrinking takes a tenth of a second per attempt."""

    @settings(database=None, derandomize=True, deadline=None, phases=[Phase.generate, Phase.shrink])
    @given(st.lists(st.integers(0, 10**6), min_size=40))
    def slow(values: list[int]) -> None:
        time.sleep(0.1)
        assert sum(values) < 1000

    slow()


def test_shrinking_stops_at_the_budget_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "LEAST_SHRINKING", 0.5)
    reports: list[str] = []
    limit = getattr(engine, runner.SHRINK_LIMIT)
    started = time.perf_counter()
    with (
        with_reporter(lambda value: reports.append(str(value))),
        report_within(1.0),
        pytest.raises(AssertionError),
    ):
        _slow_to_shrink()
    took = time.perf_counter() - started
    said = "\n".join(reports)
    assert "Shrinking stopped to report within the testing kit's 1 s" in said, f"{MOVED}\n{said}"
    assert took < 5.0, f"{MOVED}: shrinking took {took:.1f} s with a budget of 1 s"
    assert getattr(engine, runner.SHRINK_LIMIT) is limit, "the budget outlived its block"


def test_without_the_internal_the_kit_warns_and_shrinks_without_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(engine, runner.SHRINK_LIMIT)
    gone = f"{INTERNAL} is gone in Hypothesis"
    with pytest.warns(UserWarning, match=gone), report_within(1.0):
        assert not hasattr(engine, runner.SHRINK_LIMIT), "set where Hypothesis does not read it"
