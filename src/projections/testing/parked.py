"""An operator's view of a simulated cluster's parked sources: which are parked, and
retrying them until none is (used by :class:`~projections.testing.parking.ParkingSteps`
and by the waiting check, which must know that a source is parked)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress

from messaging import OperationError
from projections import _parked_ops as ops
from projections.testing.cluster import SimulatedCluster


def parked_sources(cluster: SimulatedCluster, consumers: Sequence[str]) -> list[tuple[str, str]]:
    """(consumer, source) of every source parked by ``consumers`` (those not declared yet
    have none)."""
    found = []
    for name in consumers:
        with suppress(OperationError):  # not declared by any instance yet
            found += [(name, e["source"]) for e in ops.parked(cluster.db, name)["parked"]]
    return found


def retry_parked_sources(
    cluster: SimulatedCluster, consumers: Sequence[str], *, rounds: int = 5
) -> None:
    """Have an operator retry every parked source of ``consumers`` and settle, until none
    is parked (after ``rounds`` tries, AssertionError naming those left)."""
    for _ in range(rounds):
        parked = parked_sources(cluster, consumers)
        if not parked:
            return
        for name in sorted({name for name, _ in parked}):
            with suppress(OperationError):  # all being retried already
                ops.retry(cluster.db, name, who="testing kit")
        cluster.settle()
    left = parked_sources(cluster, consumers)
    assert not left, f"parked after {rounds} retries, every message fixed: {left}"
