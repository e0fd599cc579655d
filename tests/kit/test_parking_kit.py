"""The kit's ParkingSteps on SQLite and MariaDB: a machine whose projection parks poisoned
sources keeps, through handovers, lost acknowledgements, fixes and retries, every message
applied once and each source in its order; and on a framework that does not record a park
(its held messages lost at the next claim), the same steps fail."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

import pytest
from effort import examples as scaled
from hypothesis import strategies as st
from ranked_steps import SOURCES, Step, Steps, applied
from sqlalchemy import Connection, select

from messaging.failures._parking import Parking
from messaging.waits import _progress
from messaging.waits._held import Held
from projections import _parked_ops
from projections.testing import (
    Append,
    ClusterMachine,
    ParkingSteps,
    machine_settings,
    messages_of,
    simulation_settings,
)
from projections.testing.plugin import RunMachine


class StepsMachine(ParkingSteps, ClusterMachine):
    consumers: ClassVar[Sequence[type]] = (Steps,)
    messages = messages_of(
        Step,
        topic="steps",
        source="key",
        fields={
            "key": st.sampled_from(SOURCES),
            "seq": st.integers(0, 99),
            "poison": st.just(False),
        },
    )
    poison_topics = ("steps",)
    cluster_settings = simulation_settings(projections={"on-failure": "park-source"})
    battery = ()

    def expected(self, messages: Sequence[object]) -> object:
        """Each source's seqs in the order appended."""
        found: dict[str, list[int]] = {}
        for step in messages:
            assert isinstance(step, Step)
            found.setdefault(step.key, []).append(step.seq)
        return found

    def actual(self, conn: Connection) -> object:
        """Each source's seqs in the order applied."""
        found: dict[str, list[int]] = {}
        rows = conn.execute(select(applied).order_by(applied.c.source, applied.c.rank))
        for row in rows:
            found.setdefault(row.source, []).append(row.seq)
        return found


class WaitingStepsMachine(StepsMachine):
    """The same, with the read-your-writes step: a wait is refused for a parked source."""

    read_your_writes = True


@pytest.mark.parametrize(
    ("machine", "examples"),
    [(StepsMachine, {"sqlite": 20, "mysql": 8}), (WaitingStepsMachine, {"sqlite": 10, "mysql": 4})],
    ids=["steps", "with-waits"],
)
def test_poisoned_sources_park_and_apply_once_in_order_after_retry(
    run_machine: RunMachine,
    backend: str,
    caplog: pytest.LogCaptureFixture,
    machine: type[StepsMachine],
    examples: dict[str, int],
) -> None:
    """With waits: one on a parked source's write is refused, any other answers applied."""
    caplog.set_level(logging.CRITICAL, logger="messaging")
    run_machine(machine, machine_settings(max_examples=scaled(examples[backend]), steps=30))


def test_a_park_never_recorded_is_caught(
    monkeypatch: pytest.MonkeyPatch, projections_database_url: str | None
) -> None:
    """Broken: parks are not written; the next claim forgets them, and the poisoned
    message (fixed meanwhile) is never applied."""
    monkeypatch.setattr(Parking, "write", lambda self, conn, parks: None)
    machine = StepsMachine(projections_database_url)
    try:
        machine.append(Append("steps", "s0", [Step("s0", 1)]))
        machine.append_poisoned(Append("steps", "s0", [Step("s0", 2), Step("s0", 3)]))
        machine.poll()
        machine.crash(0)
        machine.crash(0)
        machine.join()
        with pytest.raises(AssertionError, match="differs"):
            machine.settle()
    finally:
        machine.teardown()


def test_a_wait_answering_applied_for_a_parked_source_is_caught(
    monkeypatch: pytest.MonkeyPatch, projections_database_url: str | None
) -> None:
    """Broken: waits do not look at parked sources (a checkpoint past a held message
    answers "applied")."""
    monkeypatch.setattr(_progress, "held_back", lambda *args: Held({}, {}))
    machine = WaitingStepsMachine(projections_database_url)
    try:
        machine.append_poisoned(Append("steps", "s0", [Step("s0", 1)]))
        machine.poll()  # s0 parks; the checkpoint passes its message
        with pytest.raises(AssertionError, match="which is parked"):
            machine.append_and_wait(Append("steps", "s0", [Step("s0", 2)]))
    finally:
        machine.teardown()


def test_a_wait_after_a_retry_answers_applied_and_one_never_retried_is_caught(
    monkeypatch: pytest.MonkeyPatch, projections_database_url: str | None
) -> None:
    """The step appends a poisoned message, lets it park, fixes it and retries its source:
    the wait on it answers applied. Broken: the retry never happens (an operator's retry
    lost), so the wait is refused and the step fails saying so."""
    machine = StepsMachine(projections_database_url)
    try:
        machine.join()
        machine.wait_after_a_retry(Append("steps", "s0", [Step("s0", 1), Step("s0", 2)]))
        machine.settle()
    finally:
        machine.teardown()
    monkeypatch.setattr(_parked_ops, "retry", lambda *args, **kwargs: None)
    machine = StepsMachine(projections_database_url)
    try:
        machine.join()
        refused = "a wait after the retry of source 's0' was refused"
        with pytest.raises(AssertionError, match=refused):
            machine.wait_after_a_retry(Append("steps", "s0", [Step("s0", 1)]))
    finally:
        machine.teardown()
