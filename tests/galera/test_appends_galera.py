"""The application's own appends on a 3-node Galera cluster: three writers, one per node,
appending with expected versions at once through ``MessageStore.append_committed``. Their
commits collide on the tenant's position counter (certification conflicts, 1213, which
the plain ``store.append`` in a transaction raised to the application for 3 % of
requests); none reaches the writers, and every source holds its versions 1..n once."""

from __future__ import annotations

import threading

import pytest
from galera_cluster import GaleraCluster
from sqlalchemy import func, select

from messaging import Database, MessageStore
from projections.examples import ledger

pytestmark = [pytest.mark.galera, pytest.mark.mysql]

APPENDS = 150
"""Appends per writer."""


def test_three_writers_on_three_nodes_see_no_error_and_store_each_version_once(
    galera: GaleraCluster, galera_db: str
) -> None:
    databases = [Database(galera.url(node, galera_db)) for node in range(3)]
    errors: list[BaseException] = []

    def write(node: int) -> None:
        store = MessageStore(databases[node])
        try:
            for n in range(APPENDS):
                source = f"acct-{node}-{n % 5}"
                store.append_committed(
                    ledger.TOPIC, source, [ledger.Deposited(source, 1)], expected_version=n // 5
                )
        except BaseException as exc:  # the test fails naming it
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(node,)) for node in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=300)
    try:
        assert errors == []
        m = databases[0].schema.messages
        with databases[0].read() as conn:
            versions = conn.execute(
                select(
                    m.c.source, func.count(), func.min(m.c.version), func.max(m.c.version)
                ).group_by(m.c.source)
            ).all()
        assert len(versions) == 15
        assert {(count, low, high) for _, count, low, high in versions} == {(30, 1, 30)}
    finally:
        for db in databases:
            db.dispose()
