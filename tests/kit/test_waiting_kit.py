"""Read your own writes in the testing kit, on both backends: ``wait_in`` waits on a
simulated cluster through a crash and a rebuild, and a machine's ``append_and_wait`` step
holds for the ledger and catches a projection whose writes lag behind its checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pytest
from effort import examples
from hypothesis import Phase, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, select

from messaging import HandlerContext, handler
from messaging.store._rows import partition_of
from projections import projection
from projections.examples import ledger
from projections.testing import Append, ClusterMachine, machine_settings, messages_of, wait_in
from projections.testing.plugin import MakeCluster, RunMachine
from projections.testing.waiting import written

ACCOUNTS = [f"acct-{n}" for n in range(2)]


def _balances(conn: Connection) -> object:
    return ledger.read_model(conn.execute(select(ledger.balances)).mappings())


def test_wait_in_answers_once_the_read_model_shows_the_write_through_a_crash_and_a_rebuild(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster([ledger.Balances], instances=2)
    cluster.append(ledger.TOPIC, "a", [ledger.AccountOpened("a", "ada")])
    for step, amount in enumerate([5, 7, 11]):
        if step == 1:
            owner = cluster.owners()[("ledger-balances", partition_of("a", 8))] or "i0"
            cluster.crash(owner)  # its partitions move after the stale timeout
        if step == 2:
            cluster.rebuild()
        token = cluster.append(ledger.TOPIC, "a", [ledger.Deposited("a", amount)]).token
        assert wait_in(cluster, token).applied
        with cluster.db.read() as conn:
            assert _balances(conn) == ledger.replay(m for _, m in cluster.appended)


def test_wait_in_names_what_is_behind_when_nothing_can_apply_it(make_cluster: MakeCluster) -> None:
    cluster = make_cluster([ledger.Balances], instances=1)
    cluster.stop("i0")
    token = cluster.append(ledger.TOPIC, "b", [ledger.AccountOpened("b", "bob")]).token
    with pytest.raises(AssertionError, match="never answered applied: ledger-balances partition"):
        wait_in(cluster, token)
    assert written(cluster) == cluster.append(ledger.TOPIC, "c", []).token | written(cluster)


class WaitingLedgerMachine(ClusterMachine):
    """The user's ledger machine (tests/property/test_ledger_machine.py), with the step."""

    read_your_writes = True
    consumers: ClassVar[Sequence[type]] = (ledger.Balances,)
    initial = [Append(ledger.TOPIC, a, [ledger.AccountOpened(a, "ada")]) for a in ACCOUNTS]
    messages = messages_of(
        ledger.Deposited,
        topic=ledger.TOPIC,
        source="account_id",
        fields={"account_id": st.sampled_from(ACCOUNTS), "amount": st.integers(1, 100)},
    )

    def expected(self, messages: Sequence[object]) -> object:
        return ledger.replay(messages)

    def actual(self, conn: Connection) -> object:
        return _balances(conn)


def test_the_ledger_reads_its_own_writes_under_any_cluster_events(
    run_machine: RunMachine, backend: str
) -> None:
    search = examples(15 if backend == "sqlite" else 6)  # a step on MySQL: 3 times slower
    run_machine(WaitingLedgerMachine, machine_settings(max_examples=search, steps=10))


PENDING: dict[str, int] = {}
"""What the lagging projection has not written yet."""


@projection("ledger-lagging-balances", topics=ledger.TOPIC, partitions=8, tables=[ledger.balances])
class LaggingBalances:
    """Writes each deposit with the next message of its partition, not its own batch: the
    checkpoint passes a deposit whose effect is not in the read model yet."""

    @handler
    def opened(self, event: ledger.AccountOpened, ctx: HandlerContext) -> None:
        ledger.Balances().opened(event, ctx)

    @handler
    def deposited(self, event: ledger.Deposited, ctx: HandlerContext) -> None:
        for account, amount in PENDING.items():
            ledger.Balances().deposited(ledger.Deposited(account, amount), ctx)
        PENDING.clear()
        PENDING[event.account_id] = event.amount


class LaggingLedgerMachine(WaitingLedgerMachine):
    consumers: ClassVar[Sequence[type]] = (LaggingBalances,)
    battery = ()

    def __init__(self, database_url: str | None = None) -> None:
        PENDING.clear()
        super().__init__(database_url)


def test_the_step_catches_writes_that_lag_behind_the_checkpoint(run_machine: RunMachine) -> None:
    quick = settings(
        machine_settings(max_examples=50, steps=10),
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
    )
    with pytest.raises(AssertionError, match="once wait_for answered"):
        run_machine(LaggingLedgerMachine, quick)


def test_a_replayed_program_of_the_step_is_a_regular_test(
    projections_database_url: str | None,
) -> None:
    state = LaggingLedgerMachine(projections_database_url)
    try:
        with pytest.raises(AssertionError, match=r"'acct-0': \(\('ada', 5, 1\), \('ada', 0, 0\)\)"):
            state.append_and_wait(Append(ledger.TOPIC, "acct-0", [ledger.Deposited("acct-0", 5)]))
    finally:
        state.teardown()
