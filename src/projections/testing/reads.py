"""What a reader may see of a projection: the state of the messages its live version has
committed, whole. Never a version being built, never part of a batch: its read model
commits with its checkpoints. ``ClusterMachine.check_reads = True`` checks it after every
step; off by default, because it catches writes outside the transaction before the
battery's scenarios can say which one shows them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from messaging.kinds import ConsumerSpec
from messaging.operations import Ownership
from projections._kinds import PROJECTION
from projections.testing.cluster import SimulatedCluster
from projections.testing.differences import ReadModelDiffers

READ_ALL = 1_000_000
"""Messages a check reads at most (a simulated cluster holds far fewer)."""


def sole_projection(cluster: SimulatedCluster) -> ConsumerSpec | None:
    """The cluster's one transactional consumer if it is a projection (the read check
    compares one consumer's read models only)."""
    specs = [s for s in cluster.specs if s.transactional]
    return specs[0] if len(specs) == 1 and specs[0].kind is PROJECTION else None


def committed_messages(cluster: SimulatedCluster, spec: ConsumerSpec) -> Sequence[object] | None:
    """The messages of ``spec``'s topics its live version has committed (at or below the
    checkpoint of their partition), in order; None when the stored messages are not those
    the cluster appended (messages sent again, or written by something else)."""
    db = cluster.db
    with db.read() as conn:
        rows = cluster.store.read(conn, sorted(spec.topics), limit=READ_ALL)
        checkpoints = {
            r.partition: r.checkpoint for r in Ownership(db).partitions(conn, [spec.name])
        }
    appended = [message for topic, message in cluster.appended if topic in spec.topics]
    if len(rows) != len(appended) or cluster.resent:
        return None
    n = spec.partitions
    return [
        message
        for row, message in zip(rows, appended, strict=True)
        if row.position <= checkpoints.get(row.partition_hash % n, 0)
    ]


def check_reads(
    cluster: SimulatedCluster,
    expected: Callable[[Sequence[object]], object],
    actual: Callable[[Connection], object],
) -> None:
    """Raise :class:`ReadModelDiffers` unless the read model (``actual``) is the
    ``expected`` state of the messages the live version committed (one projection)."""
    spec = sole_projection(cluster)
    seen = None if spec is None else committed_messages(cluster, spec)
    state = None if seen is None else expected(seen)
    if state is None:
        return
    with cluster.db.read() as conn:
        stored = actual(conn)
    if stored is not None and stored != state:
        raise ReadModelDiffers(state, stored, what="what its live version committed")
