"""How a :class:`~projections.testing.machine.ClusterMachine` is run by Hypothesis: its
default settings, and what ``Machine.TestCase`` is (:class:`MachineCase`; it is made by
:class:`projections.testing.runner.TestCaseProperty`)."""

from __future__ import annotations

import unittest
from typing import ClassVar

import hypothesis
from hypothesis import HealthCheck, Phase, settings

__all__ = ["MachineCase", "machine_settings"]


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
