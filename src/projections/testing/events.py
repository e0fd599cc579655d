"""Cluster events as values: what happens to a :class:`SimulatedCluster`, one step each.

An event that names an instance does so by ``pick``, an index into the sorted names of
the instances it can apply to (taken modulo their number), so any event list can be
applied to any cluster; an event with no instance to apply to does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from projections.testing.cluster import SimulatedCluster


def _pick(names: Iterable[str], pick: int) -> str | None:
    ordered = sorted(names)
    return ordered[pick % len(ordered)] if ordered else None


def _as_tuple(items: Iterable[object]) -> tuple[object, ...]:
    return tuple(items)


@attrs.define(frozen=True)
class Join:
    """A new instance joins."""

    def apply(self, cluster: SimulatedCluster) -> None:
        cluster.join()


@attrs.define(frozen=True)
class _OnInstance:
    """An event for one of the instances :meth:`among` returns, chosen by ``pick``."""

    pick: int = 0

    def among(self, cluster: SimulatedCluster) -> Iterable[str]:
        return cluster.running

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        raise NotImplementedError

    def apply(self, cluster: SimulatedCluster) -> None:
        if (name := _pick(self.among(cluster), self.pick)) is not None:
            self.act(cluster, name)


@attrs.define(frozen=True)
class Stop(_OnInstance):
    """A running instance stops cleanly."""

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.stop(name)


@attrs.define(frozen=True)
class Crash(_OnInstance):
    """A running or paused instance dies without releasing anything."""

    def among(self, cluster: SimulatedCluster) -> Iterable[str]:
        return [*cluster.running, *cluster.paused]

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.crash(name)


@attrs.define(frozen=True)
class Pause(_OnInstance):
    """A running instance stops answering, keeping what it believes it owns."""

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.pause(name)


@attrs.define(frozen=True)
class Wake(_OnInstance):
    """A paused instance resumes: it polls on its old claims first, as a zombie."""

    def among(self, cluster: SimulatedCluster) -> Iterable[str]:
        return cluster.paused

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.wake(name)


@attrs.define(frozen=True)
class LoseAck(_OnInstance):
    """A running instance's next batch ends in an error of unknown outcome: it committed
    but its acknowledgement was lost (or, ``committed=False``, it rolled back with the
    connection); see :meth:`SimulatedCluster.lose_ack`."""

    committed: bool = True

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.lose_ack(name, committed=self.committed)


@attrs.define(frozen=True)
class PauseAndWake(_OnInstance):
    """A running instance freezes for ``rounds`` rebalance intervals (long enough, and it
    has turned stale and been replaced) and then wakes up as a zombie."""

    rounds: int = 4

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.pause(name)
        for _ in range(self.rounds):
            cluster.tick()
        cluster.wake(name)


@attrs.define(frozen=True)
class Pulse(_OnInstance):
    """A running instance reads its pulse: a round at once if the generation moved, unless
    ``lose_change`` (the change is lost to it until its next regular round)."""

    lose_change: bool = False

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.pulse(name, lose_change=self.lose_change)


@attrs.define(frozen=True)
class DeliverDue(_OnInstance):
    """A running instance delivers its sagas' due deadlines before it reads their topics
    again: a message that committed meanwhile (a reply in flight) must not be overtaken
    by a deadline that fell due after it was recorded."""

    def act(self, cluster: SimulatedCluster, name: str) -> None:
        cluster.deliver_due(name)


@attrs.define(frozen=True)
class Tick:
    """``times`` rebalance intervals pass; running instances heartbeat and rebalance."""

    times: int = 1

    def apply(self, cluster: SimulatedCluster) -> None:
        for _ in range(self.times):
            cluster.tick()


@attrs.define(frozen=True)
class Poll:
    """Every running instance applies one batch of each consumer."""

    def apply(self, cluster: SimulatedCluster) -> None:
        if cluster.running:
            cluster.poll_all()


@attrs.define(frozen=True)
class Append:
    """Messages of one source appended to ``topic`` in one transaction."""

    topic: str
    source: str
    messages: tuple[object, ...] = attrs.field(converter=_as_tuple)

    def apply(self, cluster: SimulatedCluster) -> None:
        cluster.append(self.topic, self.source, self.messages)


ClusterEvent = (
    Join
    | Stop
    | Crash
    | Pause
    | Wake
    | LoseAck
    | PauseAndWake
    | Pulse
    | DeliverDue
    | Tick
    | Poll
    | Append
)
"""Any one event."""


def run_events(cluster: SimulatedCluster, events: Iterable[ClusterEvent]) -> None:
    """Apply ``events`` to ``cluster`` in order."""
    for event in events:
        event.apply(cluster)
