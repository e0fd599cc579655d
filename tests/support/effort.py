"""How hard the property tests search, chosen by one environment variable.

``PROJECTIONS_TEST_EFFORT`` names a Hypothesis profile: ``dev`` (the inner loop: a fifth
of the examples), ``ci`` (the default, what ``.ci/run`` runs) or ``nightly`` (ten times
``ci``). Each test states the examples its search takes under ``ci`` through
:func:`examples`, which scales them by the profile; tests whose count is part of what
they show (a bug caught within so many examples) keep a fixed one."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EFFORT_ENV = "PROJECTIONS_TEST_EFFORT"
SCALES = {"dev": 0.2, "ci": 1.0, "nightly": 10.0}


def profile() -> str:
    """The profile the environment names (``ci`` when unset); ValueError if unknown."""
    name = os.environ.get(EFFORT_ENV, "ci")
    if name not in SCALES:
        raise ValueError(f"{EFFORT_ENV}={name!r}: choose one of {', '.join(SCALES)}")
    return name


def examples(under_ci: int) -> int:
    """``under_ci`` examples scaled to the profile (at least 1)."""
    return max(1, round(under_ci * SCALES[profile()]))


def register_profiles() -> None:
    """Register the three profiles (for tests that take Hypothesis' defaults) and load the
    one the environment names."""
    for name, scale in SCALES.items():
        settings.register_profile(
            name,
            max_examples=max(1, round(100 * scale)),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
    settings.load_profile(profile())
