"""An in-process cluster on a real database with a manual clock, driven step by step.

Every instance is a real :class:`messaging.Instance` (same registration, rebalance,
fenced commits) started without threads, so a test decides exactly when each one
heartbeats, rebalances and polls, and when time moves. Crashes, clean stops, pauses
(a process that stops answering), wake-ups (the zombie that tries to commit late) and
commits whose acknowledgement is lost are all one call each. Every call is recorded,
with what it caused (claims, releases, commits), as a scenario that reads as the Python
calls that replay it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial

from messaging import (
    Appended,
    Database,
    Distribution,
    Instance,
    MessageStore,
    NewMessage,
    OperationError,
    Settings,
    create_plugin_manager,
    is_ambiguous,
)
from messaging.kinds import ConsumerSpec, ConsumerWorker
from messaging.operations import (
    ROUTE_CONSUMER,
    ManualClock,
    NoRetiredVersion,
    Ownership,
    collect_specs,
    cutting_over,
    versions_changing,
)
from projections import _operations as operations
from projections._kinds import PROJECTION
from projections._version_commands import rollback
from projections.testing.database import configured_database, scratch_database
from projections.testing.outcomes import (
    DiesAtCommit,
    OutcomeLosingDatabase,
    ProcessDied,
    UnknownOutcome,
)
from projections.testing.records import (
    Claimed,
    Commit,
    Delivery,
    Overtaken,
    Recorder,
    version_of,
)
from projections.testing.simulation import simulation_settings
from sagas import SagaWorker

_OPERATOR = "projections.testing"
"""Who the simulated operator commands are recorded as, in the audit log."""


_CUTOVER_ROUNDS = 50  # rounds a settle goes on for, at most, while a new version takes over
POLL_TAKES = 1e-6
"""Seconds of the manual clock each poll of an instance takes: no two polls share a "now",
so a saga deadline scheduled again after its delivery never has the due time it had."""


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
        self.overtaken: list[Overtaken] = []
        """Deliveries made while a message recorded before their due time was unapplied."""
        self.moves = 0
        """Claims and releases so far."""
        self.claims: list[Claimed] = []
        """Every claim, in order."""
        self.appended: list[tuple[str, object]] = []
        """(topic, message) of every message appended, in position order."""
        self.resent: list[tuple[str, object]] = []
        """(topic, message) of every message sent again under its id (see :meth:`resend`)."""
        self._destinations = {s.name for s in self.specs if s.kind is ROUTE_CONSUMER}
        self.sagas = [s.name for s in self.specs if _is_saga(s)]
        """The sagas among the consumers."""
        self._sent: dict[int, tuple[NewMessage, object]] = {}
        """Position → what was sent there, for the messages sent to route consumers."""
        self.running: dict[str, Instance] = {}
        self.distributions: dict[str, Distribution] = {}
        """Consumer name → its distribution, as the instances started so far configured it."""
        self.paused: dict[str, Instance] = {}
        self.log: list[str] = []
        """What happened, in order: the calls, each with the time and what it caused."""
        self._names: dict[str, str] = {}
        self._databases: dict[str, OutcomeLosingDatabase] = {}
        """Instance name → its view of the database (see :meth:`lose_ack`)."""
        self._lost = 0  # messages of the last batch whose outcome was lost
        self._joined = 0
        self.started_at = self.clock.value  # scenario times are counted from it
        self._notes: list[str] = []
        self._hooks = create_plugin_manager(
            [], plugins=[Recorder(self), *plugins], load_entrypoints=False
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
        and rebalances once. Ids (the assignor's order) are not random, so that a run replays
        exactly: each newcomer's sorts first (most moves, if an assignor is not sticky)."""
        name = f"i{self._joined}" if name is None else name
        db = OutcomeLosingDatabase(self.db, partial(self._outcome_lost, name))
        self._databases[name] = db
        instance_id = f"{0xFFFF - self._joined:032x}"
        instance = Instance(
            db, self.specs, self.settings, self._hooks, name=name, instance_id=instance_id
        )
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

    def crash_during_commit(self, name: str) -> None:
        """The process dies in the middle of its next batch: every consumer of instance
        ``name`` polls once and the process is gone right before the batch would commit
        (the transaction rolls back; whatever the handlers did elsewhere stays done).
        Nothing is released, as in :meth:`crash`."""
        instance = self.running.pop(name)
        for worker in instance.workers.values():
            if isinstance(worker, ConsumerWorker):
                worker.fence.ownership = DiesAtCommit(worker.fence.ownership)
        with suppress(ProcessDied):
            self._poll(instance)
        self._record(f"crash_during_commit({name!r})")

    def lose_ack(self, name: str, *, committed: bool = True) -> int:
        """The next batch of instance ``name`` ends in an error of unknown outcome (a lost
        connection, see :func:`messaging.is_ambiguous`): every consumer of the instance
        polls once, and the first batch that moves a checkpoint commits and the worker
        never hears so (``committed=True``: the acknowledgement is lost), or it is rolled
        back with the connection (``committed=False``: ``COMMIT`` never reached the
        database). The worker cannot tell the two apart: it re-reads its claims and goes on
        as it does in production. Returns how many messages the batch held (0 when nothing
        was pending: then nothing is lost). The commit is recorded in :attr:`commits`,
        although the worker never reports it."""
        instance, db = self.running[name], self._databases[name]
        db.lose_next_outcome(committed=committed)
        self._lost = 0
        self.clock.advance(POLL_TAKES)
        try:
            for worker in instance.workers.values():
                try:
                    worker.poll()
                except Exception as exc:  # not retried in place (a poison prefix): the
                    if not is_ambiguous(exc):  # worker's loop logs it and polls again
                        raise
                    self.note(f"{name}'s poll failed with the lost connection: {exc}")
        finally:
            db.keep_outcomes()
        lost = self._lost
        call = f"lose_ack({name!r})" if committed else f"lose_ack({name!r}, committed=False)"
        self._record(call, f"{lost} message(s) of unknown outcome" if lost else "nothing pending")
        return lost

    def _outcome_lost(self, name: str, outcome: UnknownOutcome) -> None:
        """Record a batch of ``name`` whose outcome its worker did not learn."""
        spec = next(s for s in self.specs if s.name == outcome.consumer)
        moved = outcome.moved
        count = outcome.messages(self.store, spec)
        self._lost = count
        last = max(m.after for m in moved.values())
        parts = " ".join(f"p{p}/e{m.epoch}" for p, m in sorted(moved.items()))
        if outcome.committed:
            self.commits.append(
                Commit(
                    name,
                    spec.name,
                    {p: m.epoch for p, m in moved.items()},
                    last,
                    count,
                    version_of(self, spec.name),
                )
            )
            self.note(
                f"{name} committed {spec.name} {parts}: {count} up to {last}, and lost the "
                "acknowledgement"
            )
        else:
            self.note(
                f"{name} lost the connection before committing {spec.name} {parts} "
                f"({count} up to {last}): rolled back"
            )

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

    def pulse(self, name: str, *, lose_change: bool = False) -> bool:
        """Instance ``name`` reads its pulse and runs a round at once if the generation moved;
        returns whether it did. ``lose_change``: the change is lost to it (as a stale read or
        a lost bump would): it takes the generation as seen and waits for its next round."""
        instance = self.running[name]
        due = instance.pulser.beat()
        if lose_change:
            instance.rebalancer.generation = instance.pulser.last.generation  # type: ignore[union-attr]
        elif due:
            instance.rebalance()
        self._record(f"pulse({name!r}{', lose_change=True' if lose_change else ''})")
        return due and not lose_change

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

    def append(self, topic: str, source: str, messages: Sequence[object]) -> Appended:
        """Append ``messages`` of one source in one transaction; return positions and token.

        To a route consumer's destination they are sent, as :meth:`MessageStore.send`
        does, keyed by ``source`` and each with a message id of its own (``source#n``)."""
        with self.db.transaction() as conn:
            if topic in self._destinations:
                sent = [
                    self.store.outgoing(topic, message, key=source, message_id=f"{source}#{n}")
                    for n, message in enumerate(messages, start=len(self._sent))
                ]
                positions = self.store.append_encoded(conn, sent)
                self._sent.update(zip(positions, zip(sent, messages, strict=True), strict=True))
            else:
                positions = self.store.append(conn, topic, source, messages)
        self.appended.extend((topic, message) for message in messages)
        self._record(f"append({topic!r}, {source!r}, {list(messages)!r})")
        return positions

    @property
    def sent(self) -> dict[int, object]:
        """Position → message, of the messages sent to route consumers so far."""
        return {position: message for position, (_, message) in self._sent.items()}

    def resend(self, positions: Sequence[int]) -> list[int]:
        """Send the messages sent to a route consumer at ``positions`` again, under the same
        message ids, as a sender retrying after an unknown outcome does; return the new
        positions. They are recorded in :attr:`resent`, not in :attr:`appended`."""
        unknown = [p for p in positions if p not in self._sent]
        if unknown:
            raise ValueError(f"no message was sent to a route consumer at positions {unknown}")
        again = [self._sent[p] for p in positions]
        with self.db.transaction() as conn:
            new = self.store.append_encoded(conn, [sent for sent, _ in again])
        self._sent.update(zip(new, again, strict=True))
        self.resent.extend((sent.topic, message) for sent, message in again)
        self._record(f"resend({list(positions)!r})")
        return new

    def roll_back(self) -> None:
        """The next batch of every transactional consumer, on every running instance, is
        applied and rolled back: an operator pause fences the partitions under new
        epochs first (their owners' commits fail), and a resume lets the consumers run
        again, so a later round claims the partitions and applies the batch once more."""
        names = []
        for name in [spec.name for spec in self.specs if spec.transactional]:
            with suppress(OperationError):  # cutting over to a new version: applies nothing
                operations.pause(self.db, name, who=_OPERATOR, reason="roll a batch back")
                names.append(name)
        applied = self._poll_all()
        for name in names:
            operations.resume(self.db, name, who=_OPERATOR)
        # A poll counts what it committed: the batches rolled back count nothing.
        committed = f" ({applied} messages committed nevertheless)" if applied else ""
        self._record(
            "roll_back()", f"each consumer's next batch applied, then rolled back{committed}"
        )

    def rebuild(self) -> list[str]:
        """Ask for a rebuild of every projection (an operator's ``projections rebuild``);
        the next round performs it. Returns their names."""
        names = [spec.name for spec in self.specs if spec.kind is PROJECTION]
        for name in names:
            operations.rebuild(self.db, name, who=_OPERATOR)
        self._record("rebuild()")
        return names

    def rollback(self) -> list[str]:
        """``projections rollback`` of every projection whose live version replaced one."""
        names = []
        for spec in self.specs:
            if spec.kind is PROJECTION:
                with suppress(NoRetiredVersion):  # none to go back to: nothing changes
                    rollback(self.db, spec.name, who=_OPERATOR)
                    names.append(spec.name)
        self._record("rollback()", f"rolled back {', '.join(names) or 'none'}")
        return names

    def lose_in_round(self, name: str, nth: int, *, committed: bool = True) -> None:
        """The ``nth`` transaction of instance ``name``'s next rebalance round (a claim, a
        release, a cutover step) loses its acknowledgement, or (``committed=False``) rolls
        back with the connection; the round is retried as the instance's loop does."""
        instance, db = self.running[name], self._databases[name]
        db.lose_transaction(nth, committed=committed)
        try:
            instance.retry(instance.rebalance, "rebalance")
        except Exception as exc:  # the loop logs it and plans again next round
            self.note(f"{name}'s round failed again: {exc}")
        finally:
            db.keep_outcomes()
        self._record(f"lose_in_round({name!r}, {nth}, committed={committed})")

    def poll(self, name: str) -> int:
        """One batch of every consumer of one running instance."""
        applied = self._poll(self.running[name])
        self._record(f"poll({name!r})")
        return applied

    def deliver_due(self, name: str) -> int:
        """A running instance delivers its sagas' due deadlines before reading their topics
        again, as when a message commits between its read of the topics and its delivery;
        returns how many it delivered."""
        self.clock.advance(POLL_TAKES)
        workers = self.running[name].workers.values()
        delivered = sum(w.deliver_due() for w in workers if isinstance(w, SagaWorker))
        self._record(f"deliver_due({name!r})", f"delivered {delivered}")
        return delivered

    def poll_all(self) -> int:
        """One batch of every consumer of every running instance."""
        applied = self._poll_all()
        self._record("poll_all()")
        return applied

    def poll_hop(self) -> int:
        """One batch of every consumer of every running instance, the consumers in reverse
        order of declaration: what a handler sends in this poll is applied by the next one
        (one hop of a flow per poll), never later in the same poll."""
        applied = self._poll_all(hop=True)
        self._record("poll_hop()")
        return applied

    def _poll_all(self, *, hop: bool = False) -> int:
        return sum(self._poll(instance, hop=hop) for instance in self.running.values())

    def _poll(self, instance: Instance, *, hop: bool = False) -> int:
        self.clock.advance(POLL_TAKES)
        workers: list[ConsumerWorker] = list(instance.workers.values())
        return sum(worker.poll() for worker in (reversed(workers) if hop else workers))

    def settle(self, each_round: Callable[[], None] = lambda: None) -> int:
        """Time passes with no failures: rounds go by (``each_round`` is called after each)
        until one moves nothing and every partition is owned by a running instance, or
        for as long as any handover may take; then every running instance polls until
        nothing is left, and while a version of a projection is being built, rounds and
        polls go on until it took over. Returns how many messages were applied."""
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
        for _ in range(_CUTOVER_ROUNDS):
            if not versions_changing(self.db, [s.name for s in self.specs]):
                break
            self._tick(None)
            each_round()
            while count := self._poll_all():
                applied += count
        self._record("settle()", f"applied {applied}")
        return applied

    # -- observing ---------------------------------------------------------------------------

    def owners(self) -> dict[tuple[str, int], str | None]:
        """(consumer, partition) → its owner's name (None: unowned), but for a projection whose
        new version takes over (its live version stopped on purpose)."""
        names = [s.name for s in self.specs]
        with self.db.read() as conn:
            rows = Ownership(self.db).partitions(conn, names)
            stopped = cutting_over(self.db, conn, names)
        return {
            (r.consumer, r.partition): self._names.get(r.owner or "", r.owner)
            for r in rows
            if r.consumer not in stopped
        }

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


def _is_saga(spec: ConsumerSpec) -> bool:
    """Whether ``spec`` is applied by a saga's worker (its kind's, through public names)."""
    worker = spec.options.worker or spec.kind.worker
    return isinstance(worker, type) and issubclass(worker, SagaWorker)
