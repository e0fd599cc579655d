"""The distribution protocol as a state machine on a real SQLite database with a manual
clock: instances join, stop, crash, pause and wake up late; messages are appended and
applied. Whatever happens, no partition is committed by two instances under one epoch,
epochs and checkpoints never decrease, every message is applied exactly once, and every
partition is owned again within the handover bounds.

Broken variants of the framework (no fence, checkpoint outside the transaction, a
non-sticky assignor) are run against the same machine and must be caught.
"""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from effort import examples
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
    update,
)

from messaging import HandlerContext, handler, message
from messaging.distribution._membership import Membership
from messaging.store._rows import POSITION
from projections import projection
from projections.testing import (
    Append,
    ClusterMachine,
    machine_settings,
    messages_of,
    simulation_settings,
)

metadata = MetaData()


def _applied_table(name: str) -> Table:
    """A table of one projection (a rebuild swaps a projection's own tables)."""
    return Table(
        name,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("consumer", String(20), nullable=False),
        Column("position", BigInteger, nullable=False),
    )


TABLES = {"partitioned": _applied_table("sim_applied"), "single": _applied_table("sim_single")}


@message("test.sim.event")
@attrs.define(frozen=True)
class Event:
    n: int


@projection("sim-partitioned", topics="sim", partitions=4, tables=[TABLES["partitioned"]])
class Partitioned:
    @handler
    def event(self, event: Event, ctx: HandlerContext) -> None:
        record = {"consumer": "partitioned", "position": ctx.envelope.position}
        ctx.execute(insert(TABLES["partitioned"]), record)


@projection("sim-single", topics="sim", partitions=2, tables=[TABLES["single"]])
class Single:
    @handler
    def event(self, event: Event, ctx: HandlerContext) -> None:
        ctx.execute(
            insert(TABLES["single"]), {"consumer": "single", "position": ctx.envelope.position}
        )


CONSUMERS = {"sim-partitioned": "partitioned", "sim-single": "single"}


class ProtocolMachine(ClusterMachine):
    """Cluster events against the real protocol; the kit's invariants plus the protocol's
    own: effects never applied twice even for a moment, and a join moving only to the
    joiner."""

    consumers = (Partitioned, Single)
    initial_instances = 0
    messages = messages_of(
        Event, topic="sim", source=st.text("abcdefgh", min_size=1, max_size=2), max_messages=6
    )
    cluster_settings = simulation_settings(
        projections={"consumers": {"sim-single": {"distribution": "single-owner"}}}
    )

    def expected(self, messages: object) -> dict[str, list[int]]:
        """Every position, once: positions start at 1 and are never skipped."""
        positions = list(range(1, len(self.cluster.appended) + 1))
        return {consumer: positions for consumer in CONSUMERS.values()}

    def actual(self, conn: Connection) -> dict[str, list[int]]:
        return {consumer: sorted(self._applied(conn, consumer)) for consumer in CONSUMERS.values()}

    @staticmethod
    def _applied(conn: Connection, consumer: str) -> list[int]:
        table = TABLES[consumer]
        return list(conn.execute(select(table.c.position)).scalars())

    def _stable(self) -> bool:
        """Every partition owned by a running instance and the partitioned consumer's shares
        balanced: the sticky assignor's fixed point, from which a join is a clean test."""
        owners = self.cluster.owners()
        if not self.cluster.running or self.cluster.paused:
            return False
        if any(owner not in self.cluster.running for owner in owners.values()):
            return False
        stale = self.cluster.settings.messaging.consumer.stale_instance_timeout
        with self.cluster.db.read() as conn:
            live = {i.name for i in Membership(self.cluster.db).instances(conn, stale) if i.live}
        if live != set(self.cluster.running):  # a crashed instance still counts as live
            return False
        shares = Counter(o for (c, _), o in owners.items() if c == "sim-partitioned")
        counts = [shares.get(name, 0) for name in self.cluster.running]
        return max(counts) - min(counts) <= 1

    @precondition(lambda self: self._stable() and self._members() < self.max_instances)
    @rule()
    def join_moves_only_to_the_joiner(self) -> None:
        """On a stable cluster, a join moves partitions only to the new instance."""
        before = self.cluster.owners()
        joiner = self.cluster.join().name
        for _ in range(3):
            self.cluster.tick()
            self.cluster.poll_all()
        after = self.cluster.owners()
        moved = {k: (before[k], after[k]) for k in before if after[k] != before[k]}
        assert all(new == joiner for _, new in moved.values()), (
            f"a join moved partitions between existing instances: {moved}"
        )

    @invariant()
    def nothing_applied_twice(self) -> None:
        with self.cluster.db.read() as conn:
            for consumer in CONSUMERS.values():
                counts = Counter(self._applied(conn, consumer))
                twice = [p for p, n in counts.items() if n > 1]
                assert not twice, f"{consumer} applied positions {twice} twice"


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


def _checkpoint_outside_the_transaction(self, batch, immediate, parts=None):  # type: ignore[no-untyped-def]
    """Effects committed first, the fenced checkpoint in a second transaction."""
    with self.db.transaction() as conn:
        rows = self._fetch(conn, batch.claims) if batch.rows is None else batch.rows
        if not rows:
            return rows
        positions = [row[POSITION] for row in rows]
        ctx = HandlerContext(conn, lambda: self.store.envelopes(conn, positions))
        self.dispatcher.apply(rows, ctx, self.spec.partitions)
        ctx.flush()
    with self.db.transaction() as conn:
        self.fence.commit(conn, batch.claims, batch.checkpoint(rows))
    return rows


def _round_robin(units, members, current, rotation=0):  # type: ignore[no-untyped-def]
    """Balanced but not sticky: sorted units dealt to sorted members."""
    ordered = sorted(set(members))
    return (
        {unit: ordered[i % len(ordered)] for i, unit in enumerate(sorted(set(units)))}
        if ordered
        else {}
    )


BROKEN = {
    "no fence": ("messaging.distribution._ownership.Ownership.commit_checkpoint", _unfenced_commit),
    "checkpoint outside the transaction": (
        "messaging.applying._worker.ConsumerWorker._commit",
        _checkpoint_outside_the_transaction,
    ),
    "non-sticky assignor": ("messaging.distribution._rebalance.assign", _round_robin),
}


def _check(machine: ProtocolMachine) -> None:
    machine.nothing_applied_twice()
    machine.no_message_committed_twice()
    machine.one_committer_per_partition_and_epoch()
    machine.epochs_and_checkpoints_never_decrease()
    machine.single_owner_consumers_have_one_owner()
    machine.partitions_owned_again_within_the_bounds()


def _zombie(machine: ProtocolMachine) -> None:
    """i0 applies, freezes past the stale timeout, i1 takes over and applies, i0 wakes."""
    cluster = machine.cluster
    cluster.join("i0")
    for n in range(8):
        machine.append(Append("sim", "abcd"[n % 4], [Event(n)]))
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
    machine.cluster.join()
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


ProtocolMachine.TestCase.settings = machine_settings(max_examples=examples(30), steps=40)
TestProtocol = ProtocolMachine.TestCase


def test_a_pulse_hands_over_at_once_and_a_lost_change_only_delays() -> None:
    """A clean stop bumps the generation: the survivor's next pulse runs a round and owns
    everything with no time passing. When that change is lost to it (a stale read, a lost
    bump) it owns nothing more until its next regular round, which then catches up; the
    machine's invariants hold throughout."""
    for lose in (False, True):
        machine = ProtocolMachine()
        cluster = machine.cluster
        try:
            cluster.join("i0")
            cluster.join("i1")
            machine.settle()
            for n in range(6):
                machine.append(Append("sim", "abcd"[n % 4], [Event(n)]))
            cluster.stop("i1")
            before = cluster.clock.value
            assert cluster.pulse("i0", lose_change=lose) is not lose
            owners = set(cluster.owners().values())
            assert owners == ({None, "i0"} if lose else {"i0"}), owners
            assert not cluster.pulse("i0"), "an unchanged generation asked for a round"
            _check(machine)
            if lose:
                cluster.tick()
                assert set(cluster.owners().values()) == {"i0"}
            assert (
                cluster.clock.value - before
                <= cluster.settings.messaging.consumer.rebalance_interval
            )
            machine.settle()
            _check(machine)
        finally:
            machine.teardown()
