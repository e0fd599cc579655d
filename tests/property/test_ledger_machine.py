"""The testing kit as a user meets it, on the ledger example: a state machine written
against the kit passes for the ledger's projection and catches one that is not
idempotent under replay, with a shrunk scenario that replays as a regular test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pytest
from effort import examples
from hypothesis import Phase, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, bindparam, select, update

from messaging import HandlerContext, handler
from projections import projection
from projections.examples import ledger
from projections.testing import Append, ClusterMachine, machine_settings, messages_of
from projections.testing.plugin import RunMachine

# -- the user test: about twenty lines -------------------------------------------------------

ACCOUNTS = [f"acct-{n}" for n in range(2)]


class LedgerMachine(ClusterMachine):
    consumers: ClassVar[Sequence[type]] = (ledger.Balances,)
    initial = [Append(ledger.TOPIC, a, [ledger.AccountOpened(a, "ada")]) for a in ACCOUNTS]
    messages = messages_of(
        ledger.Deposited,
        ledger.Withdrawn,
        topic=ledger.TOPIC,
        source="account_id",
        fields={"account_id": st.sampled_from(ACCOUNTS), "amount": st.integers(1, 100)},
    )

    def expected(self, messages: Sequence[object]) -> object:
        return ledger.replay(messages)

    def actual(self, conn: Connection) -> object:
        return ledger.read_model(conn.execute(select(ledger.balances)).mappings())


def test_the_ledger_projection_holds_under_any_cluster_events(run_machine: RunMachine) -> None:
    """Whatever happens to the cluster, the balances equal a sequential replay (the
    defaults' 25 runs under the ci profile)."""
    run_machine(LedgerMachine, machine_settings(max_examples=examples(25)))


# -- a deliberately broken projection ---------------------------------------------------------

SET_BALANCE = (
    update(ledger.balances)
    .where(ledger.balances.c.account_id == bindparam("account"))
    .values(balance=bindparam("total"), entries=bindparam("count"))
)


@projection("ledger-cached-balances", topics=ledger.TOPIC, partitions=8, tables=[ledger.balances])
class CachedBalances:
    """Keeps each balance in memory and writes it whole: right on one instance that never
    fails, wrong once a partition is applied elsewhere or a batch is rolled back."""

    def __init__(self) -> None:
        self.totals: dict[str, tuple[int, int]] = {}

    @handler
    def opened(self, event: ledger.AccountOpened, ctx: HandlerContext) -> None:
        ledger.Balances().opened(event, ctx)

    @handler
    def deposited(self, event: ledger.Deposited, ctx: HandlerContext) -> None:
        self._add(ctx, event.account_id, event.amount)

    @handler
    def withdrawn(self, event: ledger.Withdrawn, ctx: HandlerContext) -> None:
        self._add(ctx, event.account_id, -event.amount)

    def _add(self, ctx: HandlerContext, account: str, delta: int) -> None:
        total, count = self.totals.get(account, (0, 0))
        self.totals[account] = (total + delta, count + 1)
        ctx.execute(SET_BALANCE, {"account": account, "total": total + delta, "count": count + 1})


class CachedLedgerMachine(LedgerMachine):
    consumers = (CachedBalances,)
    battery = ()  # the search alone: the battery's handover scenario catches it at once


def test_a_projection_not_idempotent_under_replay_is_caught_with_a_replayable_scenario(
    run_machine: RunMachine,
) -> None:
    """The machine fails on the cached projection. The failure shows the cluster scenario
    and Hypothesis' program, which fails the same way when run as a regular test. (Not
    shrunk here, to keep the suite fast; shrinking only shortens both. The battery is
    off: tests/kit/test_catalogue.py shows it catching such projections first.)"""
    quick = settings(
        machine_settings(max_examples=100, steps=40),
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
    )
    with pytest.raises(AssertionError, match="read model differs") as failure:
        run_machine(CachedLedgerMachine, quick)
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    assert "Cluster scenario" in notes and "cluster.join('i0')" in notes, notes
    program = notes[notes.index("state = CachedLedgerMachine()") : notes.index("state.teardown()")]
    with pytest.raises(AssertionError, match="read model differs"):  # as pasted into a test
        exec(program + "state.teardown()", {**vars(ledger), **globals()})


MAILBOX: dict[str, tuple[str, int, int]] = {}
"""Another system the next projection sends balances to."""


@projection("ledger-mailed-balances", topics=ledger.TOPIC, partitions=8, tables=[ledger.balances])
class MailedBalances:
    """Sends each new balance to another system from the handler, outside the transaction:
    a batch that rolls back (a zombie's, whose fence failed) has been sent all the same."""

    @handler
    def opened(self, event: ledger.AccountOpened) -> None:
        MAILBOX[event.account_id] = (event.owner, 0, 0)

    @handler
    def deposited(self, event: ledger.Deposited) -> None:
        owner, total, count = MAILBOX[event.account_id]
        MAILBOX[event.account_id] = (owner, total + event.amount, count + 1)


class MailedLedgerMachine(LedgerMachine):
    consumers = (MailedBalances,)

    def __init__(self, database_url: str | None = None) -> None:
        MAILBOX.clear()
        super().__init__(database_url)

    def actual(self, conn: Connection) -> object:
        return dict(MAILBOX)


@pytest.mark.parametrize(
    ("machine", "caught"), [(LedgerMachine, False), (MailedLedgerMachine, True)]
)
def test_a_zombie_scenario_replayed_as_a_regular_test_catches_writes_outside_the_transaction(
    machine: type[LedgerMachine], caught: bool, projections_database_url: str | None
) -> None:
    """i0 applies the openings, freezes with a deposit pending, is replaced and wakes: its
    batch rolls back, but what it sent elsewhere stays sent, and the deposit counts twice."""
    state = machine(projections_database_url)
    try:
        state.poll()
        state.append(Append(ledger.TOPIC, "acct-0", [ledger.Deposited("acct-0", 5)]))
        state.pause_and_wake(pick=0, rounds=4)
        if caught:
            twice = r"'acct-0': \(\('ada', 5, 1\), \('ada', 10, 2\)\)"
            with pytest.raises(AssertionError, match=twice):
                state.settle()
        else:
            state.settle()
    finally:
        state.teardown()
