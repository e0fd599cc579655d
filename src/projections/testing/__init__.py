"""Testing kit: a battery of fixed scenarios, simulated clusters of real instances on a
real database with a manual clock, Hypothesis strategies of cluster events and messages,
golden payloads and old payloads for upcasters, and a state machine base class with the
protocol's invariants. Also a pytest plugin (``projections.testing.plugin``) with the
``make_cluster`` and ``run_machine`` fixtures."""

from projections.testing.battery import (
    BATTERY,
    BatteryFailure,
    Run,
    Samples,
    Scenario,
    run_battery,
    samples_of,
)
from projections.testing.cluster import SimulatedCluster, open_cluster
from projections.testing.database import DATABASE_ENV, configured_database, scratch_database
from projections.testing.differences import Difference, ReadModelDiffers, differences
from projections.testing.events import (
    Append,
    ClusterEvent,
    Crash,
    DeliverDue,
    Join,
    LoseAck,
    Pause,
    PauseAndWake,
    Poll,
    Pulse,
    Stop,
    Tick,
    Wake,
    run_events,
)
from projections.testing.machine import ClusterMachine
from projections.testing.outcomes import (
    OutcomeLosingDatabase,
    UnknownOutcome,
    unknown_outcome_error,
)
from projections.testing.parked import retry_parked_sources
from projections.testing.parking import ParkingSteps
from projections.testing.payloads import (
    Golden,
    golden_payloads,
    old_payloads,
    read_stored,
    shaped_like,
)
from projections.testing.records import Claimed, Commit, Delivery, Overtaken
from projections.testing.runner import REPORT_SECONDS, report_within, run_cluster_machine
from projections.testing.simulation import SIMULATION_CONFIG, simulation_settings
from projections.testing.strategies import (
    SOURCES,
    cluster_events,
    messages_of,
    pauses,
    picks,
    ticks,
)
from projections.testing.testcase import machine_settings
from projections.testing.versions import VersionSteps
from projections.testing.waiting import wait_in

__all__ = [
    "BATTERY",
    "DATABASE_ENV",
    "REPORT_SECONDS",
    "SIMULATION_CONFIG",
    "SOURCES",
    "Append",
    "BatteryFailure",
    "Claimed",
    "ClusterEvent",
    "ClusterMachine",
    "Commit",
    "Crash",
    "DeliverDue",
    "Delivery",
    "Difference",
    "Golden",
    "Join",
    "LoseAck",
    "OutcomeLosingDatabase",
    "Overtaken",
    "ParkingSteps",
    "Pause",
    "PauseAndWake",
    "Poll",
    "Pulse",
    "ReadModelDiffers",
    "Run",
    "Samples",
    "Scenario",
    "SimulatedCluster",
    "Stop",
    "Tick",
    "UnknownOutcome",
    "VersionSteps",
    "Wake",
    "cluster_events",
    "configured_database",
    "differences",
    "golden_payloads",
    "machine_settings",
    "messages_of",
    "old_payloads",
    "open_cluster",
    "pauses",
    "picks",
    "read_stored",
    "report_within",
    "retry_parked_sources",
    "run_battery",
    "run_cluster_machine",
    "run_events",
    "samples_of",
    "scratch_database",
    "shaped_like",
    "simulation_settings",
    "ticks",
    "unknown_outcome_error",
    "wait_in",
]
