"""Commits of unknown outcome in the simulated cluster, on SQLite and MariaDB: the batch's
real transaction commits (or rolls back), its worker sees the error a connection lost
during COMMIT raises, re-reads its claims and goes on; the battery's scenario passes on
the real framework and fails, in a sentence, on one that applies such a batch again."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs
import pytest
from hypothesis import strategies as st
from sqlalchemy import Connection, select

from messaging import Database, is_ambiguous
from messaging._consumers import collect_specs
from messaging.applying._fence import Fence
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._ownership import Claim, Ownership
from messaging.store._rows import partition_of
from projections.examples import ledger
from projections.testing import (
    BATTERY,
    Append,
    BatteryFailure,
    ClusterEvent,
    LoseAck,
    SimulatedCluster,
    open_cluster,
    run_battery,
    run_events,
    unknown_outcome_error,
)
from projections.testing.plugin import MakeCluster

OPENED = Append(ledger.TOPIC, "acct-0", [ledger.AccountOpened("acct-0", "ada")])
DEPOSIT = Append(ledger.TOPIC, "acct-0", [ledger.Deposited("acct-0", 5)])
PARTITION = partition_of("acct-0", collect_specs([ledger.Balances])[0].partitions)


def _balances(cluster: SimulatedCluster) -> dict[str, tuple[str, int, int]]:
    with cluster.db.read() as conn:
        return ledger.read_model(conn.execute(select(ledger.balances)).mappings())


def _replayed(cluster: SimulatedCluster) -> dict[str, tuple[str, int, int]]:
    return ledger.replay(message for _, message in cluster.appended)


def _checkpoints(cluster: SimulatedCluster) -> dict[int, int]:
    with cluster.db.read() as conn:
        rows = Ownership(cluster.db).partitions(conn, [cluster.specs[0].name])
    return {row.partition: row.checkpoint for row in rows}


def _owner(cluster: SimulatedCluster) -> str:
    owner = cluster.owners()[cluster.specs[0].name, PARTITION]
    assert owner is not None
    return owner


def _settled(make_cluster: MakeCluster) -> SimulatedCluster:
    cluster = make_cluster([ledger.Balances], instances=2)
    run_events(cluster, [OPENED])
    cluster.settle()
    return cluster


def test_the_error_is_one_of_unknown_outcome_on_each_backend(database_url: str) -> None:
    db = Database(database_url)
    try:
        error = unknown_outcome_error(db)
        assert is_ambiguous(error), error
        assert ("2013" in str(error)) is (not db.is_sqlite), error
    finally:
        db.dispose()


def test_a_lost_ack_commits_once_and_the_worker_goes_on(
    make_cluster: MakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _settled(make_cluster)
    owner = _owner(cluster)
    commits = len(cluster.commits)
    [position] = cluster.append(DEPOSIT.topic, DEPOSIT.source, DEPOSIT.messages)
    with caplog.at_level(logging.INFO, logger="messaging.store.retry"):  # INFO within a storm
        assert cluster.lose_ack(owner) == 1
    assert any(
        r.name == "messaging.store.retry" and "outcome unknown" in r.getMessage()
        for r in caplog.records
    ), "the worker never saw an error of unknown outcome"
    assert _balances(cluster) == _replayed(cluster), "the batch did not commit"
    assert len(cluster.commits) == commits + 1 and cluster.commits[-1].count == 1
    assert cluster.commits[-1].instance == owner
    assert cluster.commits[-1].last_position == position
    worker = cluster.running[owner].workers[cluster.specs[0].name]
    assert isinstance(worker, ConsumerWorker)
    assert worker.claims()[PARTITION].checkpoint == position, "the moved checkpoint not taken"
    assert cluster.poll_all() == 0 and cluster.settle() == 0, "the batch was applied again"
    assert len(cluster.commits) == commits + 1
    assert "and lost the acknowledgement" in cluster.scenario()
    assert f"cluster.lose_ack({owner!r})  #" in cluster.scenario()


def test_a_commit_rolled_back_with_the_connection_is_retried_in_place(
    make_cluster: MakeCluster,
) -> None:
    cluster = _settled(make_cluster)
    owner = _owner(cluster)
    before = _checkpoints(cluster)
    commits = len(cluster.commits)
    [position] = cluster.append(DEPOSIT.topic, DEPOSIT.source, DEPOSIT.messages)
    assert cluster.lose_ack(owner, committed=False) == 1
    assert before[PARTITION] < position == _checkpoints(cluster)[PARTITION]
    assert _balances(cluster) == _replayed(cluster)
    assert [c.count for c in cluster.commits[commits:]] == [1], "not committed exactly once"
    assert "rolled back" in cluster.scenario()
    assert f"cluster.lose_ack({owner!r}, committed=False)" in cluster.scenario()


def test_nothing_pending_loses_nothing_and_the_next_commit_is_acknowledged(
    make_cluster: MakeCluster,
) -> None:
    cluster = _settled(make_cluster)
    owner = _owner(cluster)
    assert cluster.lose_ack(owner) == 0
    assert "nothing pending" in cluster.log[-1]
    cluster.append(DEPOSIT.topic, DEPOSIT.source, DEPOSIT.messages)
    assert cluster.poll_all() == 1, "an acknowledgement was lost outside lose_ack"


def test_the_event_replays_through_run_events(projections_database_url: str | None) -> None:
    """The same events give the same scenario and read model, run after run."""
    events: list[ClusterEvent] = [
        OPENED,
        LoseAck(0),
        DEPOSIT,
        LoseAck(0),
        DEPOSIT,
        LoseAck(1, committed=False),
    ]
    scenarios = []
    for _ in range(2):
        with open_cluster([ledger.Balances], database_url=projections_database_url) as cluster:
            cluster.join()
            cluster.join()
            run_events(cluster, events)
            cluster.settle()
            assert _balances(cluster) == _replayed(cluster)
            assert _replayed(cluster)["acct-0"][1] == 10
            scenarios.append(cluster.scenario())
    assert scenarios[0] == scenarios[1]
    assert scenarios[0].count("lose_ack(") == 3


def _ledger_machine() -> type:
    from projections.testing import ClusterMachine, messages_of

    class LostAckLedgerMachine(ClusterMachine):
        consumers: ClassVar[Sequence[type]] = (ledger.Balances,)
        initial = [OPENED]
        messages = messages_of(
            ledger.Deposited,
            topic=ledger.TOPIC,
            source="account_id",
            fields={"account_id": st.just("acct-0")},
        )
        battery = tuple(s for s in BATTERY if s.name == "lost acknowledgement")

        def expected(self, messages: Sequence[object]) -> object:
            return ledger.replay(messages)

        def actual(self, conn: Connection) -> object:
            return ledger.read_model(conn.execute(select(ledger.balances)).mappings())

    return LostAckLedgerMachine


def test_the_scenario_passes_on_the_framework(projections_database_url: str | None) -> None:
    run_battery(_ledger_machine(), projections_database_url)


_COMPARE_AND_SET = Ownership.commit_checkpoint


def _fenced_on_owner_and_epoch_only(
    self: Ownership, conn: Connection, name: str, owner: str, claims: Mapping[int, Claim], at: int
) -> None:
    """The checkpoint's compare-and-set without the expected checkpoint (as before issue
    10): it expects whatever checkpoint is stored."""
    held = self.owned(conn, name, owner, claims)
    stored = {p: attrs.evolve(c, checkpoint=held[p].checkpoint) for p, c in claims.items()}
    _COMPARE_AND_SET(self, conn, name, owner, stored, at)


def test_the_scenario_catches_a_framework_that_applies_a_lost_ack_batch_again(
    projections_database_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the re-read before the retry and without the compare-and-set on the
    checkpoint, the batch whose acknowledgement was lost is applied a second time."""
    monkeypatch.setattr(Fence, "_reread", lambda self, claims, error: None)
    monkeypatch.setattr(Ownership, "commit_checkpoint", _fenced_on_owner_and_epoch_only)
    with pytest.raises(BatteryFailure) as failure:
        run_battery(_ledger_machine(), projections_database_url)
    report = str(failure.value)
    assert report.startswith(
        "the battery's scenario 'lost acknowledgement' failed: a batch whose "
        "acknowledgement was lost took effect twice or not at all"
    ), report
    assert "more committed than appended" in report, report
    assert "state.lose_ack(pick=" in report and "cluster.lose_ack(" in report, report
