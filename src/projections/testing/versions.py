"""Steps that change a projection's version, for a :class:`ClusterMachine`.

Mix :class:`VersionSteps` into a machine (``class M(VersionSteps, ClusterMachine)``) and
its search also rebuilds the projections (a new version built beside the live one while
instances join, crash, freeze and lose acknowledgements), rolls them back to the version
the live one replaced, and loses the outcome of any transaction of a rebalance round (a
cutover's steps included). The machine's invariants hold throughout (no message committed
twice by any version, one committer per partition and epoch); set ``check_reads = True``
to also check that no reader ever sees a version being built.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from messaging.operations import ConsumerState, unit_rows, versions_changing
from projections._kinds import PROJECTION
from projections.testing.cluster import SimulatedCluster
from projections.testing.strategies import picks


def _steady(machine: VersionSteps) -> bool:
    """No version being built or taking over, and no rebuild asked for."""
    cluster = machine.cluster
    names = [s.name for s in cluster.specs if s.kind is PROJECTION]
    with cluster.db.read() as conn:
        rows = unit_rows(cluster.db, conn, names)
    return all(r.state == ConsumerState.RUNNING for r in rows if r.live) and not (
        versions_changing(cluster.db, names)
    )


class VersionSteps(RuleBasedStateMachine):
    """Rebuild, rollback and lost-round steps (mixed into a ``ClusterMachine``)."""

    cluster: SimulatedCluster

    @precondition(_steady)
    @rule()
    def request_rebuild(self) -> None:
        """An operator asks for a rebuild of every projection; the new versions are built
        among whatever steps follow, and take over."""
        self.cluster.rebuild()

    @precondition(_steady)
    @rule()
    def request_rollback(self) -> None:
        """An operator rolls every projection that has one back to the version its live
        one replaced: built again from where it was retired, it takes over."""
        self.cluster.rollback()

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks(), nth=st.integers(1, 4), committed=st.booleans())
    def round_loses_an_outcome(self, pick: int, nth: int, committed: bool) -> None:
        """The ``nth`` transaction of an instance's next round (a claim, a release, a step
        of a cutover) commits and loses its acknowledgement, or rolls back."""
        names = sorted(self.cluster.running)
        self.cluster.lose_in_round(names[pick % len(names)], nth, committed=committed)
