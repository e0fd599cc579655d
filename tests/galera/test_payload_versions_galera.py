"""A rolling deploy to a newer payload version on a 3-node Galera cluster: an older
instance applies through node 0, a newer one through node 1, which writes ``shop.sale``
version 3 while an older producer writes through node 2. The older instance leaves each
partition at its first version 3 message (recorded through node 0, read by the newer
instance on node 1); after it stops, every sale is applied exactly once, equal on every
node."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import shapes_tables
from clusters import lag, owned_by, owners, start_instance, stop_instance, wait_until
from galera_cluster import GaleraCluster
from galera_ledger import instance_config
from shapes_app import write_generations
from shapes_tables import newer_sales, sales_count
from sqlalchemy import select

from messaging import Database, MessageStore
from messaging._settings import ConflictRetrySettings
from messaging.distribution._ownership import Ownership
from messaging.store._retry import retry_transient

CONFLICTS = ConflictRetrySettings(max_retries=20, max_delay=0.5)

pytestmark = [pytest.mark.galera, pytest.mark.mysql, pytest.mark.multiprocess]

CONSUMER = "shop-sales"
NEWER = "needs a newer declaration of type 'shop.sale' version 3"


def _sales(db: Database) -> dict[str, int]:
    with db.read() as conn:
        rows = conn.execute(select(shapes_tables.sales.c.order_id, shapes_tables.sales.c.amount))
        return {order: amount for order, amount in rows}


def test_a_newer_payload_written_through_one_node_is_left_by_an_older_instance_on_another(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    nodes = [Database(galera.url(node, galera_db)) for node in range(galera.size)]
    old_producer, newer_producer = nodes[2], nodes[1]
    write_generations(old_producer, times=2)  # 8 sales of three generations
    configs = {
        name: instance_config(tmp_path / f"{name}.yaml", galera.multi_url(galera_db, order))
        for name, order in [("old-on-node0", [0, 2, 1]), ("new-on-node1", [1, 2, 0])]
    }
    logs = {name: tmp_path / f"{name}.log" for name in configs}
    old = start_instance(
        configs["old-on-node0"], "old-on-node0", "shapes_app", log=logs["old-on-node0"]
    )
    new = None
    try:
        wait_until(lambda: owned_by(nodes[0], {"old-on-node0"}, CONSUMER), timeout=60, what="old")
        wait_until(lambda: sales_count(nodes[0]) == 8, timeout=60, what="the older generations")
        new = start_instance(
            configs["new-on-node1"], "new-on-node1", "shapes_newer_app", log=logs["new-on-node1"]
        )
        wait_until(
            lambda: "new-on-node1" in {name for name, _ in owners(nodes[1], CONSUMER).values()},
            timeout=60,
            what="the newer instance to take a share",
        )
        for round_ in range(4):  # both producers at once, through their own nodes

            def newer(first: int = 4 * round_) -> None:
                with newer_producer.transaction() as conn:
                    MessageStore(newer_producer).append_encoded(conn, newer_sales(4, first=first))

            # a certification conflict between the two nodes' appends (1213) rolled back:
            # retried, as an application appending through several nodes does
            retry_transient(newer, CONFLICTS, what="the newer producer's append")
            retry_transient(
                partial(write_generations, old_producer, first=2 + round_),
                CONFLICTS,
                what="the older producer's append",
            )
        wait_until(lambda: sales_count(nodes[1]) == 8 + 16 + 16, timeout=90, what="every sale")
        assert NEWER in logs["old-on-node0"].read_text()
        assert stop_instance(old) == 0
        wait_until(lambda: owned_by(nodes[1], {"new-on-node1"}, CONSUMER), timeout=60, what="new")
        wait_until(lambda: lag(nodes[1], CONSUMER) == 0, timeout=60, what="no lag")
        with nodes[1].read() as conn:
            parts = Ownership(nodes[1]).partitions(conn, [CONSUMER])
        assert {p.status for p in parts} == {"running"}  # nothing halted (a double apply would)
    finally:
        for process in [old, *([new] if new else [])]:
            if process.poll() is None:
                stop_instance(process)
    expected = {f"n{i}": 100 + i for i in range(16)}
    stored = wait_until(
        lambda: all(sales_count(db) == 40 for db in nodes) and [_sales(db) for db in nodes],
        timeout=30,
        what="every node to have every sale",
    )
    assert stored[0] == stored[1] == stored[2]
    assert {k: v for k, v in stored[0].items() if k.startswith("n")} == expected
    assert "halt" not in logs["old-on-node0"].read_text().lower()
    assert NEWER not in logs["new-on-node1"].read_text()
    for db in nodes:
        db.dispose()
