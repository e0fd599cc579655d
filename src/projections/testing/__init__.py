"""Testing kit: drive a cluster of instances step by step on a real database."""

from projections.testing.cluster import Commit, SimulatedCluster

__all__ = ["Commit", "SimulatedCluster"]
