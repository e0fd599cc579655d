"""Read your own writes in the testing kit: wait on a simulated cluster, and the step that
states that after ``wait_for`` the read models show every write.

A simulated cluster moves only when told to, so :func:`wait_in` moves it between the
checks of :func:`messaging.wait_for` as the instances' own loops would: every running
instance polls once, and when that applies nothing, a rebalance interval passes (heartbeats
and rounds: handovers, a crashed member's partitions, a rebuild's cutover). It never settles
more than the wait needs: the check answers as soon as the consumers applied the token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sqlalchemy import func, select

from messaging import ConsistencyToken, Progress, WaitRefused, wait_for
from projections.testing.cluster import _CUTOVER_ROUNDS, SimulatedCluster
from projections.testing.differences import ReadModelDiffers
from projections.testing.events import Append
from projections.testing.parked import parked_sources
from projections.testing.protocols import Machine

__all__ = ["append_and_wait", "wait_in", "written"]


def wait_in(
    cluster: SimulatedCluster,
    token: ConsistencyToken | str,
    consumers: Sequence[str] | None = None,
    *,
    each_round: Callable[[], None] = lambda: None,
) -> Progress:
    """:func:`messaging.wait_for` on ``cluster``, which moves between checks (see the
    module; ``each_round`` is called after each round). ``consumers``: by default every
    transactional one. AssertionError naming what is behind when the consumers have not
    applied it once rounds went by for the handover bound and a cutover."""
    names = list(consumers or [s.name for s in cluster.specs if s.transactional])
    interval = cluster.settings.messaging.consumer.rebalance_interval
    rounds = math.ceil(cluster.handover_bound / interval) + 2 + _CUTOVER_ROUNDS
    while True:
        progress = wait_for(cluster.db, token, names, fail_fast=True)
        if progress.applied:
            cluster.note(f"wait_for({names}): applied")
            return progress
        if cluster.poll_all():
            continue
        if rounds == 0:
            behind = "; ".join(map(str, progress.behind))
            raise AssertionError(f"wait_for({names}) never answered applied: {behind}")
        rounds -= 1
        cluster.tick()
        each_round()


def written(cluster: SimulatedCluster) -> ConsistencyToken:
    """The token of every message appended to ``cluster`` so far (each topic's last
    position, every partition)."""
    m = cluster.db.schema.messages
    with cluster.db.read() as conn:
        rows = conn.execute(
            select(m.c.topic, func.max(m.c.position))
            .where(m.c.tenant == cluster.db.tenant)
            .group_by(m.c.topic)
        ).all()
    return ConsistencyToken(cluster.db.tenant, tuple((t, None, int(p)) for t, p in rows))


def append_and_wait(machine: Machine, batch: Append) -> None:
    """Append ``batch`` and wait on its token (from the append itself), then on the token of
    every write, until every transactional consumer applied them: the read models must
    then equal the expected state of every message appended (read your own writes).

    With parked sources (:class:`~projections.testing.parking.ParkingSteps`), the wait on
    ``batch`` must be refused exactly when its source is parked (a checkpoint past a held
    message is not "applied"); the read models are compared once the parking steps have
    retried every parked source."""
    cluster = machine.cluster
    names = [s.name for s in cluster.specs if s.transactional]
    token = cluster.append(batch.topic, batch.source, batch.messages).token
    machine.batches[batch.topic, batch.source] = batch
    try:
        wait_in(cluster, token, each_round=machine.observe_ownership)
    except WaitRefused as refused:
        if batch.source not in {source for _, source in parked_sources(cluster, names)}:
            raise AssertionError(
                f"wait_for refused a write of source {batch.source!r}, which is not parked: "
                f"{refused}"
            ) from refused
        cluster.note(f"wait_for: refused, source {batch.source!r} parked")
        return
    if batch.source in {source for _, source in parked_sources(cluster, names)}:
        raise AssertionError(
            f"wait_for answered applied for a write of source {batch.source!r}, which is "
            "parked: its messages are held back"
        )
    try:
        wait_in(cluster, written(cluster), each_round=machine.observe_ownership)
    except AssertionError:
        if parked_sources(cluster, names):
            return  # a token naming no source waits while any source is parked
        raise
    with cluster.db.read() as conn:
        actual = machine.actual(conn)
    expected = machine.expected([message for _, message in cluster.appended])
    if expected is not None and actual != expected:
        raise ReadModelDiffers(expected, actual, what="the expected state once wait_for answered")
