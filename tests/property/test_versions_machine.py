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
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sqlalchemy import Connection, select

from messaging._errors import OperationError
from messaging.runtime._versions import unit_rows, versions_changing
from projections._operations import rebuild
from projections._version_commands import rollback
from projections.examples import ledger
from projections.testing import Append, ClusterMachine, machine_settings, messages_of
from projections.testing.plugin import RunMachine
from projections.testing.strategies import picks

ACCOUNTS = [f"acct-{n}" for n in range(3)]
BALANCES = "ledger-balances"


class VersionsMachine(ClusterMachine):
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

    def _steady(self) -> bool:
        """No version being built or taking over, and no rebuild asked for."""
        db = self.cluster.db
        with db.read() as conn:
            (live,) = [r for r in unit_rows(db, conn, [BALANCES]) if r.live]
        return live.state == "running" and not versions_changing(db, [BALANCES])

    @precondition(lambda self: self._steady())
    @rule()
    def request_rebuild(self) -> None:
        """An operator asks for a rebuild; the version is built among whatever follows."""
        rebuild(self.cluster.db, BALANCES, who="machine")
        self.cluster.note("an operator asked for a rebuild")

    @precondition(lambda self: self._steady())
    @rule()
    def request_rollback(self) -> None:
        """An operator rolls back to the version the live one replaced, if there is one
        (otherwise the refusal changes nothing)."""
        db = self.cluster.db
        try:
            version = rollback(db, BALANCES, who="machine")
        except OperationError as refused:
            with db.read() as conn:
                kept = [r for r in unit_rows(db, conn, [BALANCES]) if r.retired_by]
            assert "no retired version" in str(refused) or not kept, refused
            return
        self.cluster.note(f"an operator rolled back to version {version}")

    @precondition(lambda self: self.cluster.running)
    @rule(pick=picks(), nth=st.integers(1, 4), committed=st.booleans())
    def round_loses_an_outcome(self, pick: int, nth: int, committed: bool) -> None:
        """The ``nth`` transaction of an instance's next round (a claim, a release, a step
        of a cutover) commits and loses its acknowledgement, or rolls back with the
        connection; the round is retried as the instance's loop retries it."""
        names = sorted(self.cluster.running)
        name = names[pick % len(names)]
        instance, db = self.cluster.running[name], self.cluster._databases[name]
        db.lose_transaction(nth, committed=committed)
        try:
            instance.retry(instance.rebalance, "rebalance")
        except Exception as exc:  # the loop logs it and plans again next round
            self.cluster.note(f"{name}'s round failed: {exc}")
        finally:
            db.keep_outcomes()
        lost = "committed, acknowledgement lost" if committed else "rolled back"
        self.cluster.note(f"{name}'s round: its transaction {nth} {lost}, retried")


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
    examples = 8 if backend == "sqlite" else 3
    run_machine(VersionsMachine, machine_settings(max_examples=examples, steps=30))
