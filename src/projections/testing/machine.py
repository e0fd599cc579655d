"""A Hypothesis state machine of the cluster for the application's own consumers.

Subclass :class:`ClusterMachine`, name the consumers, a strategy of appends and (for
exactly-once effects) the expected and actual read-model state; Hypothesis then joins,
stops, crashes, pauses and wakes instances, loses commit acknowledgements, lets time
pass and appends messages, and checks the built-in invariants after every step. On a
failure the shrunk run is printed twice: Hypothesis' ``state.…()`` program, which replays
it with every check when pasted into a test, and the cluster scenario, which says which
instance did what, in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from typing import ClassVar

from hypothesis import currently_in_test_context, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from hypothesis.strategies import SearchStrategy
from sqlalchemy import Connection, select

from messaging import Distribution, Settings
from messaging.kinds import partition_of
from messaging.operations import Ownership, PartitionStatus
from projections.testing.battery import BATTERY, Scenario
from projections.testing.cluster import SimulatedCluster, open_cluster
from projections.testing.differences import ReadModelDiffers
from projections.testing.events import (
    Append,
    Crash,
    DeliverDue,
    Join,
    LoseAck,
    Pause,
    PauseAndWake,
    Poll,
    Pulse,
    Stop,
    Tick,
    Wake,
)
from projections.testing.lineage import Lineage, handled
from projections.testing.reads import check_reads
from projections.testing.runner import TestCaseProperty
from projections.testing.strategies import pauses, picks, ticks
from projections.testing.waiting import append_and_wait

HANDOVERS = ("join", "stop", "crash", "freeze")
"""How :meth:`ClusterMachine.append_across_a_handover` moves a partition."""

_messages = st.runner().flatmap(lambda machine: machine.messages)
"""The machine's own strategy of appends."""


class ClusterMachine(RuleBasedStateMachine):
    """Cluster events against the application's consumers, with the protocol's invariants.

    Set ``consumers`` (the decorated classes) and ``messages`` (a strategy of
    :class:`Append`, see :func:`messages_of`); optionally ``initial`` appends made
    before the first step, ``initial_instances``, ``max_instances`` and
    ``cluster_settings``. Override
    :meth:`expected` and :meth:`actual` to check the read models after every settle;
    add checks of your own with ``@invariant()``.

    Built in: no partition committed by two instances under one epoch; epochs and
    checkpoints never decrease; no message committed twice, every message committed
    once and the read models equal to the expected state after settling; a single-owner
    consumer never owned by two running instances; every partition owned by a running
    instance again within the handover bound; no saga deadline delivered twice, none
    delivered before a message of its partition recorded before it fell due, and none
    due but undelivered after settling.
    """

    consumers: ClassVar[Sequence[type]] = ()
    messages: ClassVar[SearchStrategy[Append]]
    initial: ClassVar[Sequence[Append]] = ()
    cluster_settings: ClassVar[Settings | None] = None
    """None: :func:`simulation_settings` (short intervals, small batches)."""
    check_reads: ClassVar[bool] = False
    """Check after every step that readers see what the live version committed, whole (a
    one-projection machine; see :mod:`projections.testing.reads`)."""
    initial_instances: ClassVar[int] = 2
    """Instances joined before the first step (after the ``initial`` appends)."""
    max_instances: ClassVar[int] = 4
    """Running and paused instances at most."""
    TestCase = TestCaseProperty()
    """``TestLedger = LedgerMachine.TestCase``: a unittest test case running the battery,
    then the search with :func:`machine_settings` (or the case's ``settings``), on the
    configured database."""
    read_your_writes: ClassVar[bool] = False
    """True: the step :meth:`append_and_wait` too (for read models that need no time to
    pass once their messages are applied: no saga deadlines)."""
    battery: ClassVar[Sequence[Scenario]] = BATTERY
    """The fixed scenarios run before the random search (see
    :mod:`projections.testing.battery`); add your own, or scenarios for new failure
    modes of the framework, by extending it: ``battery = (*BATTERY, my_scenario)``."""

    def __init__(self, database_url: str | None = None) -> None:
        """Open a cluster (no instance yet) on the configured database, or ``database_url``."""
        super().__init__()
        name = type(self).__name__
        if not self.consumers or not hasattr(self, "messages"):
            raise TypeError(f"{name} must set `consumers` and `messages` (a strategy)")
        self._resources = ExitStack()
        self.cluster: SimulatedCluster = self._resources.enter_context(
            open_cluster(self.consumers, settings=self.cluster_settings, database_url=database_url)
        )
        self.epochs: dict[tuple[str, int], int] = {}
        self.checkpoints: dict[tuple[str, int], int] = {}
        self.unowned_since: dict[tuple[str, int], float] = {}
        self.lineage = Lineage()
        """Which commits count as each projection's live version's, across rebuilds."""
        self.batches: dict[tuple[str, str], Append] = {}
        """(topic, source) → the last append drawn for it."""
        self.last_failure = self.cluster.clock.value
        """When an instance last crashed or froze: each failure restarts the handover bound,
        since partitions may have been assigned to the instance that just failed."""
        try:
            for batch in self.initial:
                batch.apply(self.cluster)
            for _ in range(self.initial_instances):
                self.cluster.join()
        except BaseException:
            self._resources.close()
            raise

    def teardown(self) -> None:
        if currently_in_test_context():
            note(
                "Cluster scenario (calls on the SimulatedCluster, what each caused below it):\n"
                + self.cluster.scenario()
            )
        self._resources.close()

    # -- what the application says -----------------------------------------------------------

    def expected(self, messages: Sequence[object]) -> object:
        """The read-model state that ``messages`` (every message appended, in order) should
        give, e.g. by a sequential replay. None (the default) skips the comparison (the
        battery's rebuild still compares :meth:`actual` before and after a rebuild)."""
        return None

    def actual(self, conn: Connection) -> object:
        """The read-model state as stored, read through ``conn``, comparable with
        :meth:`expected`. None (the default) skips the comparison."""
        return None

    # -- rules -------------------------------------------------------------------------------

    def _members(self) -> int:
        return len(self.cluster.running) + len(self.cluster.paused)

    def _failed(self) -> None:
        self.last_failure = self.cluster.clock.value

    @precondition(lambda self: self._members() < self.max_instances)
    @rule()
    def join(self) -> None:
        Join().apply(self.cluster)

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks())
    def stop(self, pick: int) -> None:
        Stop(pick).apply(self.cluster)

    @precondition(lambda self: self._members())
    @rule(pick=picks())
    def crash(self, pick: int) -> None:
        Crash(pick).apply(self.cluster)
        self._failed()

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks())
    def pause(self, pick: int) -> None:
        Pause(pick).apply(self.cluster)
        self._failed()

    @precondition(lambda self: self.cluster.paused)
    @rule(pick=picks())
    def wake(self, pick: int) -> None:
        Wake(pick).apply(self.cluster)

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks(), rounds=pauses())
    def pause_and_wake(self, pick: int, rounds: int) -> None:
        """The zombie case in one step: frozen past its stale timeout, then awake."""
        self._failed()
        PauseAndWake(pick, rounds).apply(self.cluster)

    @rule(batch=_messages)
    def append(self, batch: Append) -> None:
        batch.apply(self.cluster)
        self.batches[batch.topic, batch.source] = batch

    @precondition(lambda self: self.read_your_writes and self.cluster.running)
    @rule(batch=_messages)
    def append_and_wait(self, batch: Append) -> None:
        """Read your own writes (:func:`projections.testing.waiting.append_and_wait`)."""
        append_and_wait(self, batch)

    @precondition(lambda self: self.cluster.running)
    @rule(batch=_messages, how=st.sampled_from(HANDOVERS))
    def append_across_a_handover(self, batch: Append, how: str) -> None:
        """Append and apply ``batch``; move its partition away from the instance that
        applied it (``how``: a join, a clean stop, a crash or a freeze of that instance);
        append it again and settle. The search leans toward handovers, where most consumer
        bugs show."""
        self.append(batch)
        self.poll()
        owner = self._owner_of(batch)
        if how != "join" and len(self.cluster.running) < 2:
            self.join()
        if how == "join" or owner not in self.cluster.running:
            if self._members() < self.max_instances:
                self.join()
        else:
            pick = sorted(self.cluster.running).index(owner)
            if how == "stop":
                self.stop(pick)
            elif how == "crash":
                self.crash(pick)
            else:
                self.pause(pick)
        self.cluster.settle(each_round=self.observe_ownership)
        self.append(batch)
        self.settle()

    @rule(times=ticks())
    def tick(self, times: int) -> None:
        Tick(times).apply(self.cluster)

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks(), lose_change=st.booleans())
    def pulse(self, pick: int, lose_change: bool) -> None:
        """A running instance reads its pulse; a change lost to it only delays its round."""
        Pulse(pick, lose_change).apply(self.cluster)

    @precondition(lambda self: self.cluster.running)
    @rule()
    def poll(self) -> None:
        Poll().apply(self.cluster)

    @precondition(lambda self: self.cluster.running and self.cluster.sagas)
    @rule(batch=_messages, times=ticks(), pick=picks())
    def reply_in_flight(self, batch: Append, times: int, pick: int) -> None:
        """A reply races a deadline: ``batch`` is appended, time passes (deadlines may fall
        due after it was recorded), and a running instance delivers its due deadlines
        before reading the topics again (:class:`DeliverDue`)."""
        self.append(batch)
        self.tick(times)
        DeliverDue(pick).apply(self.cluster)

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks())
    def crash_during_commit(self, pick: int) -> None:
        """A running instance dies in the middle of a batch, right before it commits."""
        names = sorted(self.cluster.running)
        self.cluster.crash_during_commit(names[pick % len(names)])
        self._failed()

    def _owner_of(self, batch: Append) -> str | None:
        """The owner of ``batch``'s partition, for the first consumer of its topic."""
        spec = next(s for s in self.cluster.specs if batch.topic in s.topics)
        return self.cluster.owners().get((spec.name, partition_of(batch.source, spec.partitions)))

    def lose_ack(self, pick: int, committed: bool) -> None:
        """A running instance's next batch ends in an error of unknown outcome: it committed
        and the acknowledgement was lost, or (``committed`` False) it rolled back with the
        connection; the worker re-reads its claims and goes on."""
        LoseAck(pick, committed).apply(self.cluster)

    @precondition(lambda self: self.cluster.running)
    @rule(batch=_messages, committed=st.booleans())
    def append_and_lose_ack(self, batch: Append, committed: bool) -> None:
        """Append ``batch``; the running instance that applies it (else the first) loses
        the outcome of its next batch (:meth:`lose_ack`), which then holds ``batch``."""
        self.append(batch)
        names = sorted(self.cluster.running)
        owner = self._owner_of(batch)
        self.lose_ack(names.index(owner) if owner in names else 0, committed)

    @precondition(lambda self: self.cluster.running)
    @rule()
    def roll_back(self) -> None:
        """Every batch in flight rolls back: the next batch of each transactional consumer
        is applied and then refused by its fence (an operator pause), and the consumers run
        again (resumed), to apply it once more."""
        self.cluster.roll_back()

    @precondition(lambda self: self.cluster.sent)
    @rule(pick=st.integers(0, 7))
    def resend(self, pick: int) -> None:
        """A sender retries: one message sent to a route consumer is sent again, same id."""
        positions = sorted(self.cluster.sent)
        self.cluster.resend([positions[pick % len(positions)]])

    def poll_hop(self) -> None:
        """One hop of every flow: what a batch sends is applied at the next poll
        (:meth:`SimulatedCluster.poll_hop`)."""
        self.cluster.poll_hop()

    def poll_last_first(self) -> None:
        """Each running instance applies one batch of each consumer, the last-named first
        (messages of different partitions then apply in another order than appended)."""
        for name in sorted(self.cluster.running, reverse=True):
            self.cluster.poll(name)

    def rebuild(self) -> None:
        """Every projection is rebuilt from the start (with time passing); after settling,
        the read models must equal what they were before, and the expected state."""
        with self.cluster.db.read() as conn:
            before = self.actual(conn)
        self.cluster.rebuild()
        self.settle()
        with self.cluster.db.read() as conn:
            after = self.actual(conn)
        if after != before:
            raise ReadModelDiffers(
                before,
                after,
                "{key} is {actual} rebuilt from the start where it was {expected} built "
                "message by message",
                "the one built before the rebuild",
            )

    @precondition(lambda self: self.cluster.running)
    @rule()
    def settle(self) -> None:
        """Time passes with no failures: every message gets committed, exactly once, and
        the read models equal the expected state."""
        self.cluster.settle(each_round=self.observe_ownership)
        self.check_settled()

    def check_settled(self) -> None:
        """After :meth:`SimulatedCluster.settle`: nothing halted, every message committed
        once by each consumer that handles it, read models as expected."""
        with self.cluster.db.read() as conn:
            rows = Ownership(self.cluster.db).partitions(conn)
            actual = self.actual(conn)
        halted = [
            f"{r.consumer} p{r.partition} at position {r.halted_position}: {r.error}"
            for r in rows
            if r.status == PartitionStatus.HALTED
        ]
        assert not halted, f"halted after settling: {halted}"
        committed, handled = self._committed(), self._handled()
        assert committed == handled, (
            f"messages committed (by consumer) after settling {dict(committed)}, "
            f"handled by the consumers {dict(handled)}"
        )
        expected = self.expected([message for _, message in self.cluster.appended])
        if expected is not None and actual != expected:
            raise ReadModelDiffers(expected, actual)
        overdue = self._overdue_deadlines()
        assert not overdue, f"saga deadlines due but not delivered after settling: {overdue}"

    def _overdue_deadlines(self) -> list[tuple[str, str, str, float]]:
        """Saga deadlines due by now and still pending: (saga, key, name, due time)."""
        d = self.cluster.db.schema.deadlines
        with self.cluster.db.read() as conn:
            rows = conn.execute(
                select(d.c.saga, d.c.saga_key, d.c.name, d.c.due_at).where(
                    d.c.tenant == self.cluster.db.tenant, d.c.due_at <= self.cluster.clock.value
                )
            )
            return [(saga, key, name, float(due)) for saga, key, name, due in rows]

    # -- invariants --------------------------------------------------------------------------

    def _committed(self) -> Counter[str]:
        self._observe_versions()
        return self.lineage.committed(self.cluster.commits)

    def _handled(self) -> Counter[str]:
        return handled(self.cluster)

    @invariant()
    def no_message_committed_twice(self) -> None:
        """By any version of any consumer (a version being built included)."""
        handled = self._handled()
        committed = self.lineage.by_version(self.cluster.commits)
        over = {c: (n, handled[c[0]]) for c, n in committed.items() if n > handled[c[0]]}
        assert not over, (
            f"(committed, appended) messages by (consumer, version), more committed than "
            f"appended: {over}"
        )

    @invariant()
    def reads_see_what_the_live_version_committed(self) -> None:
        if self.check_reads:
            check_reads(self.cluster, self.expected, self.actual)

    @invariant()
    def deadlines_delivered_at_most_once(self) -> None:
        delivered = Counter((d.consumer, d.key, d.name, d.due_at) for d in self.cluster.deliveries)
        twice = {deadline: n for deadline, n in delivered.items() if n > 1}
        assert not twice, f"saga deadlines delivered more than once: {twice}"

    @invariant()
    def deadlines_never_overtake_earlier_messages(self) -> None:
        """No deadline delivered while a message of its partition recorded before it fell
        due was unapplied (:func:`~projections.testing.records.overtaken`)."""
        early = "; ".join(map(str, self.cluster.overtaken))
        assert not early, f"a saga deadline overtook a message recorded before it: {early}"

    @invariant()
    def one_committer_per_partition_and_epoch(self) -> None:
        committers: dict[tuple[str, int, int], set[str]] = {}
        for commit in self.cluster.commits:
            for partition, epoch in commit.epochs.items():
                committers.setdefault((commit.consumer, partition, epoch), set()).add(
                    commit.instance
                )
        shared = {k: v for k, v in committers.items() if len(v) > 1}
        assert not shared, f"committed by two instances under one epoch: {shared}"

    @invariant()
    def epochs_and_checkpoints_never_decrease(self) -> None:
        self._observe_versions()
        with self.cluster.db.read() as conn:
            rows = Ownership(self.cluster.db).partitions(conn)
        for row in rows:
            key = (row.consumer, row.partition)
            assert row.epoch >= self.epochs.get(key, 0), f"{key} epoch went back"
            assert row.checkpoint >= self.checkpoints.get(key, 0), f"{key} checkpoint went back"
            self.epochs[key], self.checkpoints[key] = row.epoch, row.checkpoint

    @invariant()
    def single_owner_consumers_have_one_owner(self) -> None:
        single = {
            name
            for name, distribution in self.cluster.distributions.items()
            if distribution is Distribution.SINGLE_OWNER
        }
        if not single:
            return
        owners: dict[str, set[str]] = {name: set() for name in single}
        for (consumer, _), owner in self.cluster.owners().items():
            if consumer in single and owner:
                owners[consumer].add(owner)
        for name, names in owners.items():
            # Two owners are fine while one of them has failed and awaits its successor.
            assert len(names) <= 1 or not names <= set(self.cluster.running), (
                f"{name} is single-owner but owned by {sorted(names)}"
            )

    @invariant()
    def partitions_owned_again_within_the_bounds(self) -> None:
        self.observe_ownership()

    def _observe_versions(self) -> None:
        names = [s.name for s in self.cluster.specs]
        self.lineage.observe(self.cluster.db, names, self.checkpoints)

    def observe_ownership(self) -> None:
        """Check, after each round of a settle or a wait, that no partition stays unowned
        longer than the handover bound (and note the versions' lineage)."""
        self._observe_versions()
        now, bound = self.cluster.clock.value, self.cluster.handover_bound
        owners = self.cluster.owners()
        for key in [k for k in self.unowned_since if k not in owners]:
            del self.unowned_since[key]  # cutting over: unowned by design, until the swap
        for key, owner in owners.items():
            if owner in self.cluster.running or not self.cluster.running:
                self.unowned_since.pop(key, None)
                continue
            since = max(self.unowned_since.setdefault(key, now), self.last_failure)
            assert now - since <= bound + 1e-6, (
                f"{key} without a running owner for {now - since:.1f}s (bound {bound}s)"
            )
