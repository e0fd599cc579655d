"""The distribution protocol as a state machine on a real SQLite database with a manual
clock: instances join, stop, crash, pause and wake up late; messages are appended and
applied. Whatever happens, no partition is committed by two instances under one epoch,
epochs and checkpoints never decrease, every message is applied exactly once, and every
partition is owned again within the handover bounds.

Broken variants of the framework (no fence, checkpoint outside the transaction, a
non-sticky assignor) are run against the same machine and must be caught.
"""

from __future__ import annotations

import itertools
import tempfile
from collections import Counter
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert, select, update

import messaging.runtime
from messaging import (
    Database,
    HandlerContext,
    ManualClock,
    MessageStore,
    handler,
    message,
    settings_from_mapping,
)
from messaging.membership import Membership
from messaging.ownership import Ownership
from projections import projection
from projections.testing import SimulatedCluster

REBALANCE, STALE, HEARTBEAT = 1.0, 3.0, 0.4
BOUND = STALE + 2 * REBALANCE  # a crash: stale + one round; a move: release + claim rounds
SETTINGS = settings_from_mapping(
    {
        "messaging": {
            "consumer": {
                "rebalance-interval": "1s",
                "stale-instance-timeout": "3s",
                "heartbeat-interval": "400ms",
                "graceful-shutdown-timeout": "2s",
                "batch-size": 4,
                "conflict-retry": {"max-retries": 3, "max-delay": "50ms"},
            }
        },
        "projections": {"consumers": {"sim-single": {"distribution": "single-owner"}}},
    }
)

metadata = MetaData()
applied = Table(
    "sim_applied",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("consumer", String(20), nullable=False),
    Column("position", BigInteger, nullable=False),
)
RECORD = insert(applied)


@message("test.sim.event")
@attrs.define(frozen=True)
class Event:
    n: int


@projection("sim-partitioned", topics="sim", partitions=4, tables=[applied])
class Partitioned:
    @handler
    def event(self, event: Event, ctx: HandlerContext) -> None:
        ctx.execute(RECORD, {"consumer": "partitioned", "position": ctx.envelope.position})


@projection("sim-single", topics="sim", partitions=2, tables=[applied])
class Single:
    @handler
    def event(self, event: Event, ctx: HandlerContext) -> None:
        ctx.execute(RECORD, {"consumer": "single", "position": ctx.envelope.position})


CONSUMERS = {"sim-partitioned": "partitioned", "sim-single": "single"}


class _DescendingIds:
    """Instance ids that sort each newcomer first: the worst case for a non-sticky assignor."""

    def __init__(self) -> None:
        self.next = 0xFFFF

    def uuid4(self) -> object:
        self.next -= 1
        return type("Id", (), {"hex": f"{self.next:032x}"})()


class ProtocolMachine(RuleBasedStateMachine):
    """Cluster events against the real protocol; invariants checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        # Instance ids decide the assignor's member order: random ones would make a replayed
        # example take other steps (Hypothesis reports that as a flaky strategy).
        self._uuid = messaging.runtime.uuid
        messaging.runtime.uuid = _DescendingIds()  # type: ignore[assignment]
        self._tmp = tempfile.TemporaryDirectory()
        self.db = Database(f"sqlite:///{Path(self._tmp.name) / 'sim.db'}", clock=ManualClock())
        self.db.prepare()
        with self.db.transaction() as conn:
            metadata.create_all(conn)
        self.cluster = SimulatedCluster(self.db, [Partitioned, Single], SETTINGS)
        self.store = MessageStore(self.db)
        self.names = (f"i{n}" for n in itertools.count())
        self.appended = 0
        self.epochs: dict[tuple[str, int], int] = {}
        self.checkpoints: dict[tuple[str, int], int] = {}
        self.unowned_since: dict[tuple[str, int], float] = {}
        self.last_failure = 0.0
        """When an instance last crashed or froze: each failure restarts the handover bound,
        since partitions may have been assigned to the instance that just failed."""

    def teardown(self) -> None:
        self.db.dispose()
        self._tmp.cleanup()
        messaging.runtime.uuid = self._uuid

    # -- rules -----------------------------------------------------------------------------

    @precondition(lambda self: len(self.cluster.running) + len(self.cluster.paused) < 4)
    @rule()
    def join(self) -> None:
        self.cluster.join(next(self.names))

    @precondition(lambda self: self.cluster.running)
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        self.cluster.stop(data.draw(st.sampled_from(sorted(self.cluster.running))))

    @precondition(lambda self: self.cluster.running or self.cluster.paused)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        everyone = sorted([*self.cluster.running, *self.cluster.paused])
        self.cluster.crash(data.draw(st.sampled_from(everyone)))
        self.last_failure = self.cluster.clock.value

    @precondition(lambda self: self.cluster.running)
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        self.cluster.pause(data.draw(st.sampled_from(sorted(self.cluster.running))))
        self.last_failure = self.cluster.clock.value

    @precondition(lambda self: self.cluster.paused)
    @rule(data=st.data())
    def wake(self, data: st.DataObject) -> None:
        self.cluster.wake(data.draw(st.sampled_from(sorted(self.cluster.paused))))

    @rule(
        count=st.integers(1, 6),
        sources=st.lists(st.text("abcdefgh", min_size=1, max_size=2), min_size=1, max_size=4),
    )
    def append(self, count: int, sources: list[str]) -> None:
        with self.db.transaction() as conn:
            for n in range(count):
                self.store.append(conn, "sim", sources[n % len(sources)], [Event(self.appended)])
                self.appended += 1
        self.cluster.log.append(f"append {count}")

    @rule(times=st.integers(1, 3))
    def tick(self, times: int) -> None:
        for _ in range(times):
            self.cluster.tick()

    @precondition(lambda self: self.cluster.running)
    @rule()
    def poll(self) -> None:
        self.cluster.poll_all()

    def _stable(self) -> bool:
        """Every partition owned by a running instance and the partitioned consumer's shares
        balanced: the sticky assignor's fixed point, from which a join is a clean test."""
        owners = self.cluster.owners()
        if not self.cluster.running or self.cluster.paused:
            return False
        if any(owner not in self.cluster.running for owner in owners.values()):
            return False
        with self.db.read() as conn:
            live = {i.name for i in Membership(self.db).instances(conn, STALE) if i.live}
        if live != set(self.cluster.running):  # a crashed instance still counts as live
            return False
        shares = Counter(o for (c, _), o in owners.items() if c == "sim-partitioned")
        counts = [shares.get(name, 0) for name in self.cluster.running]
        return max(counts) - min(counts) <= 1

    @precondition(lambda self: self._stable() and len(self.cluster.running) < 4)
    @rule()
    def join_moves_only_to_the_joiner(self) -> None:
        """On a stable cluster, a join moves partitions only to the new instance."""
        before = self.cluster.owners()
        joiner = next(self.names)
        self.cluster.join(joiner)
        for _ in range(3):
            self.cluster.tick()
            self.cluster.poll_all()
        after = self.cluster.owners()
        moved = {k: (before[k], after[k]) for k in before if after[k] != before[k]}
        assert all(new == joiner for _, new in moved.values()), (
            f"a join moved partitions between existing instances: {moved}\n"
            f"{self.cluster.scenario()}"
        )

    @precondition(lambda self: self.cluster.running)
    @rule()
    def settle(self) -> None:
        """Time passes with no failures: everything appended gets applied, exactly once."""
        for _ in range(int(BOUND / REBALANCE) + 2):
            self.cluster.tick()
            self._observe_ownership()
        while self.cluster.poll_all():
            pass
        for consumer in CONSUMERS.values():
            seen = self._applied(consumer)
            assert sorted(seen) == sorted(set(seen)), f"{consumer}: applied twice"
            assert len(seen) == self.appended, (
                f"{consumer}: {len(seen)} of {self.appended} applied after settling"
            )

    # -- invariants ------------------------------------------------------------------------

    def _applied(self, consumer: str) -> list[int]:
        with self.db.read() as conn:
            return list(
                conn.execute(
                    select(applied.c.position).where(applied.c.consumer == consumer)
                ).scalars()
            )

    @invariant()
    def nothing_applied_twice(self) -> None:
        for consumer in CONSUMERS.values():
            twice = [p for p, n in Counter(self._applied(consumer)).items() if n > 1]
            assert not twice, (
                f"{consumer} applied positions {twice} twice\n{self.cluster.scenario()}"
            )

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
        with self.db.read() as conn:
            rows = Ownership(self.db).partitions(conn)
        for row in rows:
            key = (row.consumer, row.partition)
            assert row.epoch >= self.epochs.get(key, 0), f"{key} epoch went back"
            assert row.checkpoint >= self.checkpoints.get(key, 0), f"{key} checkpoint went back"
            self.epochs[key], self.checkpoints[key] = row.epoch, row.checkpoint

    @invariant()
    def single_owner_has_one_owner(self) -> None:
        owners = {o for (c, _), o in self.cluster.owners().items() if c == "sim-single" and o}
        assert len(owners) <= 1 or any(o not in self.cluster.running for o in owners), owners

    @invariant()
    def partitions_owned_again_within_the_bounds(self) -> None:
        self._observe_ownership()

    def _observe_ownership(self) -> None:
        now = self.cluster.clock.value
        for key, owner in self.cluster.owners().items():
            if owner in self.cluster.running or not self.cluster.running:
                self.unowned_since.pop(key, None)
                continue
            since = max(self.unowned_since.setdefault(key, now), self.last_failure)
            assert now - since <= BOUND + 1e-6, (
                f"{key} without a running owner for {now - since:.1f}s (bound {BOUND}s)\n"
                f"{self.cluster.scenario()}"
            )


# -- deliberately broken variants: the machine must catch each ------------------------------


def _unfenced_commit(self, conn, consumer, instance_id, epochs, position):  # type: ignore[no-untyped-def]
    """The checkpoint update without its owner + epoch condition."""
    t = self.table
    conn.execute(
        update(t)
        .where(
            t.c.tenant == self.db.tenant,
            t.c.consumer == consumer,
            t.c.partition_no.in_(list(epochs)),
        )
        .values(checkpoint=position)
    )


def _checkpoint_outside_the_transaction(self, rows, claims, *, immediate, through=0):  # type: ignore[no-untyped-def]
    """Effects committed first, the fenced checkpoint in a second transaction."""
    with self.db.transaction() as conn:
        batch = self._fetch(conn, claims) if rows is None else rows
        if not batch:
            return batch
        positions = [row[0] for row in batch]
        ctx = HandlerContext(conn, lambda: self.store.envelopes(conn, positions))
        self.dispatcher.apply(batch, ctx, self.spec.partitions)
        ctx.flush()
    with self.db.transaction() as conn:
        self.ownership.commit_checkpoint(
            conn,
            self.spec.name,
            self.instance_id,
            {p: c.epoch for p, c in claims.items()},
            max(batch[-1][0], through),
        )
    return batch


def _round_robin(units, members, current):  # type: ignore[no-untyped-def]
    """Balanced but not sticky: sorted units dealt to sorted members."""
    ordered = sorted(set(members))
    return (
        {unit: ordered[i % len(ordered)] for i, unit in enumerate(sorted(set(units)))}
        if ordered
        else {}
    )


BROKEN = {
    "no fence": ("messaging.ownership.Ownership.commit_checkpoint", _unfenced_commit),
    "checkpoint outside the transaction": (
        "messaging.worker.ConsumerWorker._commit",
        _checkpoint_outside_the_transaction,
    ),
    "non-sticky assignor": ("messaging.rebalance.assign", _round_robin),
}


def _check(machine: ProtocolMachine) -> None:
    machine.nothing_applied_twice()
    machine.one_committer_per_partition_and_epoch()
    machine.epochs_and_checkpoints_never_decrease()
    machine.single_owner_has_one_owner()
    machine.partitions_owned_again_within_the_bounds()


def _zombie(machine: ProtocolMachine) -> None:
    """i0 applies, freezes past the stale timeout, i1 takes over and applies, i0 wakes."""
    cluster = machine.cluster
    cluster.join("i0")
    machine.append(8, ["a", "b", "c", "d"])
    cluster.pause("i0")
    for _ in range(5):
        cluster.tick()
        _check(machine)
    cluster.join("i1")
    while cluster.poll_all():
        _check(machine)
    cluster.wake("i0")
    _check(machine)
    machine.settle()


def _joins(machine: ProtocolMachine) -> None:
    """Instances join one by one onto a settled cluster."""
    machine.cluster.join(next(machine.names))
    for _ in range(3):
        machine.settle()
        machine.join_moves_only_to_the_joiner()
        _check(machine)


SCENARIOS = {
    "no fence": _zombie,
    "checkpoint outside the transaction": _zombie,
    "non-sticky assignor": _joins,
}


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_the_scenarios_pass_on_the_real_protocol(variant: str) -> None:
    """The regression scenarios that catch the broken variants hold for the real code."""
    machine = ProtocolMachine()
    try:
        SCENARIOS[variant](machine)
    finally:
        machine.teardown()


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_variants_are_caught(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each deliberately broken protocol violates an invariant the machine checks."""
    target, replacement = BROKEN[variant]
    monkeypatch.setattr(target, replacement)
    machine = ProtocolMachine()
    try:
        with pytest.raises(AssertionError):
            SCENARIOS[variant](machine)
    finally:
        machine.teardown()


MACHINE_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ProtocolMachine.TestCase.settings = MACHINE_SETTINGS
TestProtocol = ProtocolMachine.TestCase
