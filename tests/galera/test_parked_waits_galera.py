"""Waiting on a parked source's message on Galera: the worker applies through node 0, the
messages are appended through node 2 and the wait runs on node 1. The checkpoint that
passes a held-back message and the record of its parked source commit together, so the
node the wait reads never shows one without the other: refused while parked, applied
once a retry applied it (tests/integration/test_parked_waits.py on one server)."""

from __future__ import annotations

import pytest
from galera_cluster import GaleraCluster
from parking_app import BROKEN, applied, drain, items_table, parking_worker, reclaim, same_partition
from poison_item import Item

from messaging import Appended, Database, MessageStore, WaitRefused, wait_for
from projections import _parked_ops

pytestmark = [pytest.mark.galera, pytest.mark.mysql]

CONSUMER = "parked-items"


def _append(db: Database, source: str, name: str) -> Appended:
    with db.transaction() as conn:
        return MessageStore(db).append(conn, "items", source, [Item(name)])


def test_a_wait_on_another_node_is_refused_while_the_source_is_parked(
    galera: GaleraCluster, galera_db: str
) -> None:
    worker_node, waiter, writer = (Database(galera.url(n, galera_db)) for n in range(3))
    try:
        with items_table(worker_node) as table:
            worker = parking_worker(worker_node, table)
            a, b = same_partition(2)
            _append(writer, a, "a1")
            poison = _append(writer, a, "poison-a2")
            later = _append(writer, a, "a3")
            other = _append(writer, b, "b1")
            drain(worker)
            assert wait_for(waiter, other.token, CONSUMER, timeout=10).applied
            for held in (poison, later):
                with pytest.raises(WaitRefused, match=rf"holds back source '{a}'"):
                    wait_for(waiter, held.token, CONSUMER, timeout=10)

            BROKEN.clear()  # the handler is fixed; an operator retries the source
            _parked_ops.retry(writer, CONSUMER, source=a, who="test")
            reclaim(worker_node, worker)
            drain(worker)
            assert wait_for(waiter, later.token, CONSUMER, timeout=10).applied
            assert [n for s, n in applied(waiter, table) if s == a] == ["a1", "poison-a2", "a3"]
    finally:
        for db in (worker_node, waiter, writer):
            db.dispose()
