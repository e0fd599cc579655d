"""How a :class:`~projections.testing.machine.ClusterMachine` is run by Hypothesis: its
default settings, and ``Machine.TestCase``, the unittest case that runs its battery
before the search."""

from __future__ import annotations

import unittest
from functools import cache
from typing import TYPE_CHECKING, ClassVar

import hypothesis
from hypothesis import HealthCheck, Phase, settings

if TYPE_CHECKING:
    from projections.testing.machine import ClusterMachine

__all__ = ["MachineCase", "TestCaseProperty", "machine_settings"]


def machine_settings(max_examples: int = 25, steps: int = 12) -> settings:
    """Hypothesis settings sized for a simulated cluster: a few runs of a few steps (short
    runs shrink fast), no deadline (a step is several transactions), no health check
    about slow data, and no explain phase (it reruns the failure many times to say which
    lines only failing runs reach)."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


class MachineCase(unittest.TestCase):
    """What ``Machine.TestCase`` is: a unittest case whose ``settings`` (assignable, as
    ``Machine.TestCase.settings = machine_settings(...)``) the battery and search run with."""

    settings: ClassVar[hypothesis.settings]


class TestCaseProperty:
    """``Machine.TestCase``: a unittest case of the machine that runs its battery first."""

    def __get__(self, obj: ClusterMachine | None, owner: type[ClusterMachine]) -> type[MachineCase]:
        return _test_case(owner if obj is None else type(obj))


@cache
def _test_case(machine: type[ClusterMachine]) -> type[MachineCase]:
    from projections.testing.runner import run_cluster_machine  # it runs machines: imports this

    class MachineTestCase(MachineCase):
        settings = machine_settings()

        def runTest(self) -> None:
            run_cluster_machine(machine, self.settings)

    MachineTestCase.__name__ = f"{machine.__name__}.TestCase"
    MachineTestCase.__qualname__ = f"{machine.__qualname__}.TestCase"
    return MachineTestCase
