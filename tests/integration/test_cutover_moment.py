"""Messages appended at the moment of a cutover appear in the new version: while the live
version is stopped for the cutover (its final checkpoints recorded, the new version not
yet swapped in), right after the swap, and at every round in between, over several
rebuilds in a row. The read model equals the sequential replay after each one."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from messaging.versions._versions import unit_rows
from projections import _operations as operations
from projections.examples import ledger
from projections.testing import SimulatedCluster, open_cluster

BALANCES = "ledger-balances"
REBUILDS = 5


def _live(cluster: SimulatedCluster) -> tuple[int, str]:
    db = cluster.db
    with db.read() as conn:
        (live,) = [r for r in unit_rows(db, conn, [BALANCES]) if r.live]
    return live.version, live.state


def _append(cluster: SimulatedCluster, n: int) -> None:
    account = f"acct-{n % 7}"
    cluster.append(ledger.TOPIC, account, [ledger.Deposited(account, n)])


def _matches_replay(cluster: SimulatedCluster) -> bool:
    with cluster.db.read() as conn:
        actual = ledger.read_model(conn.execute(select(ledger.balances)).mappings())
    return actual == ledger.replay(message for _, message in cluster.appended)


@pytest.mark.mysql
def test_a_message_appended_at_the_cutover_appears_in_the_new_version(database_url: str) -> None:
    with open_cluster([ledger.Balances], database_url=database_url) as cluster:
        for n in range(7):
            account = f"acct-{n}"
            cluster.append(ledger.TOPIC, account, [ledger.AccountOpened(account, "ada")])
        cluster.join()
        cluster.join()
        cluster.settle()
        appended, seen = 7, set()
        for rebuild in range(REBUILDS):
            version = _live(cluster)[0]
            operations.rebuild(cluster.db, BALANCES, who="test")
            for _ in range(60):  # a round at a time: append between every two of them
                cluster.tick()
                live, state = _live(cluster)
                seen.add(state)
                if rebuild % 2:
                    cluster.poll_all()  # the instances apply before the append, or after it
                _append(cluster, appended)  # stopped, or just swapped, or still building
                appended += 1
                if not rebuild % 2:
                    cluster.poll_all()
                if live != version:
                    break
            assert _live(cluster)[0] != version, "the new version never took over"
            _append(cluster, appended)  # right after the swap
            appended += 1
            cluster.settle()
            assert _matches_replay(cluster), f"rebuild {rebuild}: the read model lost a message"
        assert "cutting-over" in seen, "no append was made while the live version was stopped"
