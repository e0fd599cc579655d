"""An in-process cluster on a real database with a manual clock, driven step by step.

Every instance is a real :class:`messaging.Instance` (same registration, rebalance,
fenced commits) started without threads, so a test decides exactly when each one
heartbeats, rebalances and polls, and when time moves. Crashes, clean stops, pauses
(a process that stops answering) and wake-ups (the zombie that tries to commit late)
are all one call each. Every call is recorded, with what it caused (claims, releases,
commits), as a scenario that reads as the Python calls that replay it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import attrs

from messaging import (
    Database,
    Distribution,
    Instance,
    ManualClock,
    MessageStore,
    Settings,
    create_plugin_manager,
    hookimpl,
    settings_from_mapping,
)
from messaging.consumers import ConsumerSpec, collect_specs
from messaging.ownership import Ownership
from messaging.worker import ConsumerWorker
from projections.testing.database import configured_database, scratch_database

SIMULATION_CONFIG: Mapping[str, object] = {
    "rebalance-interval": "1s",
    "stale-instance-timeout": "3s",
    "heartbeat-interval": "400ms",
    "graceful-shutdown-timeout": "2s",
    "batch-size": 4,
    "executor": {"max-workers": 1},
    "conflict-retry": {"max-retries": 3, "max-delay": "50ms"},
}
"""``messaging.consumer`` settings of a simulation: short intervals (the clock is manual
anyway), small batches, so that a few messages already span several batches, and one
batch at a time (on MySQL, lanes would commit in parallel, in no fixed order, and a
scenario would not replay the same way)."""


def simulation_settings(**sections: object) -> Settings:
    """Settings with :data:`SIMULATION_CONFIG` plus top-level config ``sections``, e.g.
    ``simulation_settings(projections={"consumers": {"x": {"distribution": "single-owner"}}})``.
    """
    return settings_from_mapping({"messaging": {"consumer": SIMULATION_CONFIG}, **sections})


@attrs.define(frozen=True)
class Commit:
    """One committed batch: which instance committed which partitions under which epochs."""

    instance: str
    consumer: str
    epochs: Mapping[int, int]
    last_position: int
    count: int


@attrs.define(frozen=True)
class Delivery:
    """One committed delivery of a saga deadline: by which instance, of which deadline."""

    instance: str
    consumer: str
    key: str
    name: str
    due_at: float


class _Recorder:
    """Collects commits, and notes of what each step caused, from the framework's hooks."""

    def __init__(self, cluster: SimulatedCluster) -> None:
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
        self.cluster.commits.append(Commit(name, consumer, dict(epochs), last_position, count))
        parts = " ".join(f"p{p}/e{e}" for p, e in sorted(epochs.items()))
        self.cluster.note(f"{name} committed {consumer} {parts}: {count} up to {last_position}")

    @hookimpl
    def projections_deadlines_delivered(
        self, consumer: str, instance_id: str, deadlines: Sequence[tuple[str, str, float]]
    ) -> None:
        name = self.cluster.name_of(instance_id)
        for key, deadline, due_at in deadlines:
            self.cluster.deliveries.append(Delivery(name, consumer, key, deadline, due_at))
            self.cluster.note(
                f"{name} delivered {consumer} deadline {deadline!r} of {key!r} "
                f"(due t=+{due_at - self.cluster.started_at:.1f}s)"
            )

    @hookimpl
    def projections_partition_claimed(
        self, consumer: str, partition: int, epoch: int, instance_id: str
    ) -> None:
        name = self.cluster.name_of(instance_id)
        self.cluster.moves += 1
        self.cluster.note(f"{name} claimed {consumer} p{partition}/e{epoch}")

    @hookimpl
    def projections_partition_released(
        self, consumer: str, partition: int, instance_id: str
    ) -> None:
        self.cluster.moves += 1
        self.cluster.note(f"{self.cluster.name_of(instance_id)} released {consumer} p{partition}")


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
        self.store = MessageStore(db)
        self.commits: list[Commit] = []
        self.deliveries: list[Delivery] = []
        """Saga deadlines delivered (committed), in order."""
        self.moves = 0
        """Claims and releases so far."""
        self.appended: list[tuple[str, object]] = []
        """(topic, message) of every message appended, in position order."""
        self.running: dict[str, Instance] = {}
        self.distributions: dict[str, Distribution] = {}
        """Consumer name → its distribution, as the instances started so far configured it."""
        self.paused: dict[str, Instance] = {}
        self.log: list[str] = []
        """What happened, in order: the calls, each with the time and what it caused."""
        self._names: dict[str, str] = {}
        self._joined = 0
        self.started_at = self.clock.value
        """The clock when the cluster was made: scenario times are counted from it."""
        self._notes: list[str] = []
        self._hooks = create_plugin_manager(
            [], plugins=[_Recorder(self), *plugins], load_entrypoints=False
        ).hook

    @property
    def handover_bound(self) -> float:
        """Seconds a partition may stay without a running owner after a failure: the stale
        timeout (a crash) plus two rounds (release and claim of a planned move)."""
        consumer = self.settings.messaging.consumer
        return consumer.stale_instance_timeout + 2 * consumer.rebalance_interval

    # -- membership ------------------------------------------------------------------------

    def join(self, name: str | None = None) -> Instance:
        """Start a new instance (named ``i0``, ``i1``... unless given): it registers, declares
        and rebalances once.

        Instance ids, which order the members for the assignor, are not random here, so
        that a run replays exactly: each newcomer's sorts first, which moves the most
        partitions if an assignor is not sticky."""
        name = f"i{self._joined}" if name is None else name
        instance = Instance(self.db, self.specs, self.settings, self._hooks, name=name)
        instance.id = f"{0xFFFF - self._joined:032x}"
        self._joined += 1
        self._names[instance.id] = name
        instance.start(loops=False)
        self.distributions.update(instance.distributions)
        self.running[name] = instance
        self._record(f"join({name!r})")
        return instance

    def stop(self, name: str) -> None:
        """Stop an instance cleanly: it releases everything and deletes its row."""
        self.running.pop(name).stop()
        self._record(f"stop({name!r})")

    def crash(self, name: str) -> None:
        """The process dies: nothing is released, its row ages until it is stale."""
        if self.running.pop(name, None) is None:
            self.paused.pop(name)
        self._record(f"crash({name!r})")

    def pause(self, name: str) -> None:
        """The process stops answering (GC pause, frozen VM) but keeps its state."""
        self.paused[name] = self.running.pop(name)
        self._record(f"pause({name!r})")

    def wake(self, name: str) -> int:
        """A paused process resumes where it was: it polls with the claims it still
        believes it has (and must not commit if they moved on), then catches up."""
        instance = self.paused.pop(name)
        self.running[name] = instance
        applied = self._poll(instance)
        instance.heartbeat()
        instance.rebalance()
        self._record(f"wake({name!r})", f"applied {applied} as a zombie")
        return applied

    # -- time, messages and work -----------------------------------------------------------

    def tick(self, seconds: float | None = None) -> None:
        """Move time by ``seconds`` (default one rebalance interval); every running instance
        then heartbeats and rebalances, as its loops would."""
        self._tick(seconds)
        self._record("tick()" if seconds is None else f"tick({seconds!r})")

    def _tick(self, seconds: float | None) -> None:
        step = self.settings.messaging.consumer.rebalance_interval if seconds is None else seconds
        self.clock.advance(step)
        for instance in self.running.values():
            instance.heartbeat()
        for instance in self.running.values():
            instance.rebalance()

    def append(self, topic: str, source: str, messages: Sequence[object]) -> list[int]:
        """Append ``messages`` of one source in one transaction; return their positions."""
        with self.db.transaction() as conn:
            positions = self.store.append(conn, topic, source, messages)
        self.appended.extend((topic, message) for message in messages)
        self._record(f"append({topic!r}, {source!r}, {list(messages)!r})")
        return positions

    def poll(self, name: str) -> int:
        """One batch of every consumer of one running instance."""
        applied = self._poll(self.running[name])
        self._record(f"poll({name!r})")
        return applied

    def poll_all(self) -> int:
        """One batch of every consumer of every running instance."""
        applied = self._poll_all()
        self._record("poll_all()")
        return applied

    def _poll_all(self) -> int:
        return sum(self._poll(instance) for instance in self.running.values())

    def _poll(self, instance: Instance) -> int:
        workers: list[ConsumerWorker] = list(instance.workers.values())
        return sum(worker.poll() for worker in workers)

    def settle(self, each_round: Callable[[], None] = lambda: None) -> int:
        """Time passes with no failures: rounds go by (``each_round`` is called after each)
        until one moves nothing and every partition is owned by a running instance, or
        for as long as any handover may take; then every running instance polls until
        nothing is left. Returns how many messages were applied."""
        interval = self.settings.messaging.consumer.rebalance_interval
        for _ in range(math.ceil(self.handover_bound / interval) + 2):
            moves = self.moves
            self._tick(None)
            each_round()
            if moves == self.moves and all(o in self.running for o in self.owners().values()):
                break
        applied = 0
        while count := self._poll_all():
            applied += count
        self._record("settle()", f"applied {applied}")
        return applied

    # -- observing ---------------------------------------------------------------------------

    def owners(self) -> dict[tuple[str, int], str | None]:
        """(consumer, partition) → the name of its owner (None when unowned)."""
        with self.db.read() as conn:
            rows = Ownership(self.db).partitions(conn, [s.name for s in self.specs])
        return {(r.consumer, r.partition): self._names.get(r.owner or "", r.owner) for r in rows}

    def name_of(self, instance_id: str) -> str:
        """The name an instance joined under ("?" for one this cluster did not start)."""
        return self._names.get(instance_id, "?")

    def note(self, text: str) -> None:
        """Attach ``text`` to the step in progress in the scenario."""
        self._notes.append(text)

    def _record(self, call: str, outcome: str = "") -> None:
        when = f"t=+{self.clock.value - self.started_at:.1f}s"
        self.log.append(f"cluster.{call}  # {when}{', ' + outcome if outcome else ''}")
        self.log.extend(f"#     {note}" for note in self._notes)
        self._notes.clear()

    def scenario(self) -> str:
        """The steps so far as the calls that replay them, one a line, each followed by
        comments saying what it caused."""
        return "\n".join(self.log)


@contextmanager
def open_cluster(
    consumers: Sequence[type],
    *,
    settings: Settings | None = None,
    database_url: str | None = None,
    plugins: Iterable[object] = (),
) -> Iterator[SimulatedCluster]:
    """A :class:`SimulatedCluster` of ``consumers`` on a scratch database (the configured
    one, see :func:`~projections.testing.database.configured_database`, unless
    ``database_url`` is given), with no instance yet; everything is dropped at the end."""
    specs = collect_specs(list(consumers))
    tables = [table for spec in specs for table in spec.options.tables]
    with scratch_database(database_url or configured_database(), tables) as db:
        yield SimulatedCluster(db, consumers, settings or simulation_settings(), plugins=plugins)
