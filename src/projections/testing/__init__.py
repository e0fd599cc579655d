"""Testing kit: simulated clusters of real instances on a real database with a manual
clock, Hypothesis strategies of cluster events and messages, and a state machine base
class with the protocol's invariants. Also a pytest plugin (``projections.testing.plugin``)
with the ``make_cluster`` and ``run_machine`` fixtures."""

from projections.testing.cluster import (
    SIMULATION_CONFIG,
    Commit,
    Delivery,
    SimulatedCluster,
    open_cluster,
    simulation_settings,
)
from projections.testing.database import DATABASE_ENV, configured_database, scratch_database
from projections.testing.events import (
    Append,
    ClusterEvent,
    Crash,
    Join,
    Pause,
    PauseAndWake,
    Poll,
    Stop,
    Tick,
    Wake,
    run_events,
)
from projections.testing.machine import ClusterMachine, machine_settings
from projections.testing.strategies import (
    SOURCES,
    cluster_events,
    messages_of,
    pauses,
    picks,
    ticks,
)

__all__ = [
    "DATABASE_ENV",
    "SIMULATION_CONFIG",
    "SOURCES",
    "Append",
    "ClusterEvent",
    "ClusterMachine",
    "Commit",
    "Crash",
    "Delivery",
    "Join",
    "Pause",
    "PauseAndWake",
    "Poll",
    "SimulatedCluster",
    "Stop",
    "Tick",
    "Wake",
    "cluster_events",
    "configured_database",
    "machine_settings",
    "messages_of",
    "open_cluster",
    "pauses",
    "picks",
    "run_events",
    "scratch_database",
    "simulation_settings",
    "ticks",
]
