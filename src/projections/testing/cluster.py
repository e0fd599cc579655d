"""An in-process cluster on a real database with a manual clock, driven step by step.

Every instance is a real :class:`messaging.Instance` (same registration, rebalance,
fenced commits) started without threads, so a test decides exactly when each one
heartbeats, rebalances and polls, and when time moves. Crashes, clean stops, pauses
(a process that stops answering) and wake-ups (the zombie that tries to commit late)
are all one call each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from messaging import Database, Instance, ManualClock, Settings, create_plugin_manager, hookimpl
from messaging.consumers import ConsumerSpec, collect_specs
from messaging.ownership import Ownership
from messaging.worker import ConsumerWorker


@attrs.define(frozen=True)
class Commit:
    """One committed batch: which instance committed which partitions under which epochs."""

    instance: str
    consumer: str
    epochs: Mapping[int, int]
    last_position: int


class _Recorder:
    def __init__(self, commits: list[Commit], names: Callable[[str], str]) -> None:
        self.commits = commits
        self.names = names

    @hookimpl
    def projections_batch_applied(
        self, consumer: str, epochs: Mapping[int, int], instance_id: str, last_position: int
    ) -> None:
        self.commits.append(Commit(self.names(instance_id), consumer, dict(epochs), last_position))


class SimulatedCluster:
    """Instances of ``consumers`` sharing ``db`` (whose clock must be a ManualClock)."""

    def __init__(
        self,
        db: Database,
        consumers: Sequence[type],
        settings: Settings,
        *,
        plugins: Iterable[object] = (),
    ) -> None:
        if not isinstance(db.clock, ManualClock):
            raise TypeError("a SimulatedCluster needs a Database created with clock=ManualClock()")
        self.db = db
        self.clock: ManualClock = db.clock
        self.settings = settings
        self.specs: list[ConsumerSpec] = collect_specs(list(consumers))
        self.commits: list[Commit] = []
        self.running: dict[str, Instance] = {}
        self.paused: dict[str, Instance] = {}
        self.log: list[str] = []
        """What happened, in order: a readable scenario for a failing test."""
        self._names: dict[str, str] = {}
        recorder = _Recorder(self.commits, lambda instance_id: self._names.get(instance_id, "?"))
        self._hooks = create_plugin_manager(
            [], plugins=[recorder, *plugins], load_entrypoints=False
        ).hook

    # -- membership ------------------------------------------------------------------------

    def join(self, name: str) -> Instance:
        """Start a new instance: it registers, declares and rebalances once."""
        instance = Instance(self.db, self.specs, self.settings, self._hooks, name=name)
        self._names[instance.id] = name
        instance.start(loops=False)
        self.running[name] = instance
        self.log.append(f"t={self.clock.value:.1f} join {name}")
        return instance

    def stop(self, name: str) -> None:
        """Stop an instance cleanly: it releases everything and deletes its row."""
        self.running.pop(name).stop()
        self.log.append(f"t={self.clock.value:.1f} stop {name}")

    def crash(self, name: str) -> None:
        """The process dies: nothing is released, its row ages until it is stale."""
        if self.running.pop(name, None) is None:
            self.paused.pop(name)
        self.log.append(f"t={self.clock.value:.1f} crash {name}")

    def pause(self, name: str) -> None:
        """The process stops answering (GC pause, frozen VM) but keeps its state."""
        self.paused[name] = self.running.pop(name)
        self.log.append(f"t={self.clock.value:.1f} pause {name}")

    def wake(self, name: str) -> int:
        """A paused process resumes where it was: it polls with the claims it still
        believes it has (and must not commit if they moved on), then catches up."""
        instance = self.paused.pop(name)
        self.running[name] = instance
        applied = self._poll(instance)
        instance.heartbeat()
        instance.rebalance()
        self.log.append(f"t={self.clock.value:.1f} wake {name} (applied {applied} as a zombie)")
        return applied

    # -- time and work ----------------------------------------------------------------------

    def tick(self, seconds: float | None = None) -> None:
        """Move time by ``seconds`` (default one rebalance interval); every running instance
        then heartbeats and rebalances, as its loops would."""
        step = self.settings.messaging.consumer.rebalance_interval if seconds is None else seconds
        self.clock.advance(step)
        for instance in self.running.values():
            instance.heartbeat()
        for instance in self.running.values():
            instance.rebalance()
        self.log.append(f"t={self.clock.value:.1f} tick")

    def poll(self, name: str) -> int:
        """One batch of every consumer of one running instance."""
        return self._poll(self.running[name])

    def poll_all(self) -> int:
        """One batch of every consumer of every running instance."""
        return sum(self._poll(instance) for instance in self.running.values())

    def _poll(self, instance: Instance) -> int:
        workers: list[ConsumerWorker] = list(instance.workers.values())
        return sum(worker.poll() for worker in workers)

    def owners(self) -> dict[tuple[str, int], str | None]:
        """(consumer, partition) → the name of its owner (None when unowned)."""
        with self.db.read() as conn:
            rows = Ownership(self.db).partitions(conn, [s.name for s in self.specs])
        return {(r.consumer, r.partition): self._names.get(r.owner or "", r.owner) for r in rows}

    def scenario(self) -> str:
        """The steps so far, one a line."""
        return "\n".join(self.log)
