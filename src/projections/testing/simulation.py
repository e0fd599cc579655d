"""The settings of a simulated cluster: short intervals, small batches, one lane."""

from __future__ import annotations

from collections.abc import Mapping

from messaging import Settings
from messaging.operations import settings_from_mapping

SIMULATION_CONFIG: Mapping[str, object] = {
    "rebalance-interval": "1s",
    "stale-instance-timeout": "3s",
    "heartbeat-interval": "400ms",
    "graceful-shutdown-timeout": "2s",
    "batch-size": 4,
    "executor": {"max-workers": 1},
    "conflict-retry": {"max-retries": 3, "max-delay": "50ms"},
}
"""``messaging.consumer`` settings of a simulation: short intervals (the clock is manual
anyway), small batches, so that a few messages already span several batches, and one
batch at a time (on MySQL, lanes would commit in parallel, in no fixed order, and a
scenario would not replay the same way)."""


def simulation_settings(**sections: object) -> Settings:
    """Settings with :data:`SIMULATION_CONFIG` plus top-level config ``sections``, e.g.
    ``simulation_settings(projections={"consumers": {"x": {"distribution": "single-owner"}}})``.
    """
    return settings_from_mapping({"messaging": {"consumer": SIMULATION_CONFIG}, **sections})
