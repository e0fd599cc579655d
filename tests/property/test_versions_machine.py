"""The version protocol under any cluster events: rebuilds asked for at any moment (a
version built while instances join, stop, crash, freeze and come back as zombies, and
lose commit acknowledgements), rollbacks to the replaced version, and lost outcomes of
any transaction of a rebalance round (the cutover's steps included: committed with the
acknowledgement lost, or rolled back with the connection). The kit's invariants hold
throughout: no message committed twice by any version, one committer per partition and
epoch, epochs and checkpoints never going back; after settling, the live version has
committed every message once and its read model equals the sequential replay."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pytest
from effort import examples
from hypothesis import strategies as st
from sqlalchemy import Connection, select

from projections.examples import ledger
from projections.testing import Append, ClusterMachine, VersionSteps, machine_settings, messages_of
from projections.testing.plugin import RunMachine

ACCOUNTS = [f"acct-{n}" for n in range(3)]
BALANCES = "ledger-balances"


class VersionsMachine(VersionSteps, ClusterMachine):
    consumers: ClassVar[Sequence[type]] = (ledger.Balances,)
    initial = [Append(ledger.TOPIC, a, [ledger.AccountOpened(a, "ada")]) for a in ACCOUNTS]
    messages = messages_of(
        ledger.Deposited,
        ledger.Withdrawn,
        topic=ledger.TOPIC,
        source="account_id",
        fields={"account_id": st.sampled_from(ACCOUNTS), "amount": st.integers(1, 100)},
    )
    battery = ()  # the ledger's battery runs in test_ledger_machine.py
    check_reads = True  # no reader ever sees a version being built

    def expected(self, messages: Sequence[object]) -> object:
        return ledger.replay(messages)

    def actual(self, conn: Connection) -> object:
        return ledger.read_model(conn.execute(select(ledger.balances)).mappings())


@pytest.fixture(autouse=True)
def _quiet_retries() -> Iterator[None]:
    logger = logging.getLogger("messaging")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_the_version_protocol_holds_under_any_cluster_events(
    run_machine: RunMachine, backend: str
) -> None:
    """A short search in the suite (a longer one, 150 runs of 40 steps, passed on SQLite
    when this was written: ``python -c`` with :func:`run_cluster_machine`)."""
    scaled = examples(8 if backend == "sqlite" else 3)
    run_machine(VersionsMachine, machine_settings(max_examples=scaled, steps=30))
