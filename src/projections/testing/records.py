"""What a simulated cluster's instances did, as the framework's hooks reported it: the
commits, claims and deadline deliveries each step caused, and the notes that make its
scenario readable."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs
from sqlalchemy import select

from messaging import Database, MessageStore, hookimpl
from messaging.kinds import ConsumerSpec, partition_of
from messaging.operations import Ownership, split_unit

__all__ = ["Claimed", "Commit", "Delivery", "Overtaken", "Recorder", "overtaken", "version_of"]


class Recording(Protocol):
    """Where the records go, and what they are read against: the simulated cluster
    (:class:`~projections.testing.cluster.SimulatedCluster`)."""

    db: Database
    store: MessageStore
    specs: list[ConsumerSpec]
    commits: list[Commit]
    deliveries: list[Delivery]
    overtaken: list[Overtaken]
    claims: list[Claimed]
    moves: int
    started_at: float

    def name_of(self, instance_id: str) -> str: ...

    def note(self, text: str) -> None: ...


@attrs.define(frozen=True)
class Commit:
    """One committed batch: which instance committed which partitions under which epochs,
    for which version of the consumer (1 for a consumer that is never rebuilt)."""

    instance: str
    consumer: str
    epochs: Mapping[int, int]
    last_position: int
    count: int
    version: int = 1


def version_of(cluster: Recording, consumer: str) -> int:
    """The version a commit of ``consumer`` (a live version, or ``name@N``) is made for:
    read right after the commit, before any cutover can happen (the simulated instances
    commit and rebalance in turn); the declared version, without a read, for a kind that
    is never rebuilt (its row holds the version in its code)."""
    name, version = split_unit(consumer)
    if version is not None:
        return version
    spec = next(s for s in cluster.specs if s.name == name)
    if not spec.kind.rebuildable:
        return spec.options.version
    db, c = cluster.db, cluster.db.schema.consumers
    with db.read() as conn:
        live = conn.execute(
            select(c.c.version).where(c.c.tenant == db.tenant, c.c.name == name)
        ).scalar_one_or_none()
    return int(live or 1)


@attrs.define(frozen=True)
class Claimed:
    """One claim of a partition under a new epoch (epoch > 1: it was held before)."""

    instance: str
    consumer: str
    partition: int
    epoch: int


@attrs.define(frozen=True)
class Delivery:
    """One committed delivery of a saga deadline: by which instance, of which deadline."""

    instance: str
    consumer: str
    key: str
    name: str
    due_at: float


@attrs.define(frozen=True)
class Overtaken:
    """A deadline delivered while a message of its partition recorded before it fell due
    was still unapplied: the message's position and time."""

    delivery: Delivery
    position: int
    recorded_at: float

    def __str__(self) -> str:
        d = self.delivery
        return (
            f"{d.instance} delivered {d.consumer} deadline {d.name!r} of {d.key!r} (due at "
            f"{d.due_at:.3f}) before position {self.position}, recorded at "
            f"{self.recorded_at:.3f}, was applied"
        )


def overtaken(cluster: Recording, deliveries: Sequence[Delivery]) -> list[Overtaken]:
    """The ``deliveries`` of one consumer (just committed) that a message overtook: the first
    message of the deadline's partition not applied yet (after the partition's
    checkpoint) was recorded before the deadline fell due. Two reads, however many."""
    if not deliveries:
        return []
    spec = next(s for s in cluster.specs if s.name == deliveries[0].consumer)
    partitions = {d: partition_of(d.key, spec.partitions) for d in deliveries}
    with cluster.db.read() as conn:
        rows = Ownership(cluster.db).partitions(conn, [spec.name])
        checkpoints = {
            r.partition: r.checkpoint for r in rows if r.partition in partitions.values()
        }
        unapplied = cluster.store.read(
            conn,
            spec.topics,
            partitions=checkpoints,
            partition_count=spec.partitions,
            types=spec.stored_type_names(),
            limit=_UNAPPLIED_READ,
        )
    first: dict[int, tuple[int, float]] = {}
    for row in unapplied:  # position order: each partition's first
        first.setdefault(row.partition_hash % spec.partitions, (row.position, row.recorded_at))
    found = []
    for delivery, partition in partitions.items():
        position, recorded_at = first.get(partition, (0, math.inf))
        if recorded_at < delivery.due_at:
            found.append(Overtaken(delivery, position, recorded_at))
    return found


_UNAPPLIED_READ = 100_000
"""Unapplied messages read at most per check: far more than a simulated cluster holds."""


class Recorder:
    """Collects commits, and notes of what each step caused, from the framework's hooks."""

    def __init__(self, cluster: Recording) -> None:
        self.cluster = cluster

    @hookimpl
    def projections_batch_applied(
        self,
        consumer: str,
        epochs: Mapping[int, int],
        instance_id: str,
        count: int,
        last_position: int,
    ) -> None:
        name = self.cluster.name_of(instance_id)
        version = version_of(self.cluster, consumer)
        self.cluster.commits.append(
            Commit(name, consumer, dict(epochs), last_position, count, version)
        )
        parts = " ".join(f"p{p}/e{e}" for p, e in sorted(epochs.items()))
        self.cluster.note(f"{name} committed {consumer} {parts}: {count} up to {last_position}")

    @hookimpl
    def projections_deadlines_delivered(
        self, consumer: str, instance_id: str, deadlines: Sequence[tuple[str, str, float]]
    ) -> None:
        name = self.cluster.name_of(instance_id)
        delivered = [Delivery(name, consumer, *deadline) for deadline in deadlines]
        for delivery in delivered:
            self.cluster.deliveries.append(delivery)
            self.cluster.note(
                f"{name} delivered {consumer} deadline {delivery.name!r} of {delivery.key!r} "
                f"(due t=+{delivery.due_at - self.cluster.started_at:.1f}s)"
            )
        for early in overtaken(self.cluster, delivered):
            self.cluster.overtaken.append(early)
            self.cluster.note(f"overtaken: {early}")

    @hookimpl
    def projections_partition_claimed(
        self, consumer: str, partition: int, epoch: int, instance_id: str
    ) -> None:
        name = self.cluster.name_of(instance_id)
        self.cluster.moves += 1
        self.cluster.claims.append(Claimed(name, consumer, partition, epoch))
        self.cluster.note(f"{name} claimed {consumer} p{partition}/e{epoch}")

    @hookimpl
    def projections_partition_released(
        self, consumer: str, partition: int, instance_id: str
    ) -> None:
        self.cluster.moves += 1
        self.cluster.note(f"{self.cluster.name_of(instance_id)} released {consumer} p{partition}")
