"""Removing a consumer on a 3-node Galera cluster: refused through node 1 while an
instance on node 0 declares it; once the instance running code without it is live on
node 1, health read through node 2 says ``undeclared``, and a removal through node 2
(its tables dropped) leaves nothing of it on node 0 (tests/integration/test_remove_consumer.py
on one server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import removal_app as app
from clusters import start_instance, stop_instance, wait_until, write_config
from galera_cluster import GaleraCluster
from sqlalchemy import func, inspect, select

from messaging import Database, MessageStore, OperationError
from messaging._config import load_settings
from projections._health import health_report
from projections._removal import remove

pytestmark = [pytest.mark.galera, pytest.mark.mysql, pytest.mark.multiprocess]


def _applied(db: Database) -> int:
    with db.read() as conn:
        if not inspect(conn).has_table(app.stock.name):
            return 0
        return int(conn.execute(select(func.coalesce(func.sum(app.stock.c.qty), 0))).scalar_one())


def _rows(db: Database, consumer: str) -> int:
    s = db.schema
    with db.read() as conn:
        return sum(
            int(
                conn.execute(
                    select(func.count()).select_from(t).where(column == consumer)
                ).scalar_one()
            )
            for t, column in (
                (s.consumers, s.consumers.c.name),
                (s.partitions, s.partitions.c.consumer),
            )
        )


def test_a_consumer_removed_through_one_node_is_gone_on_the_others(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    nodes = [Database(galera.url(node, galera_db)) for node in range(3)]
    configs = [write_config(tmp_path / f"node{n}.yaml", nodes[n]) for n in range(3)]
    with nodes[2].transaction() as conn:
        MessageStore(nodes[2]).append(conn, app.ITEMS, "apple", [app.Received("apple", 5)])
    everything = start_instance(configs[0], "g0", "removal_app", log=tmp_path / "g0.log")
    wait_until(lambda: _applied(nodes[1]) == 5, timeout=60, what="rm-stock applied")
    with pytest.raises(OperationError, match=r"live instance\(s\) g0 \(pid"):
        remove(nodes[1], "rm-stock", who="test")
    assert stop_instance(everything) == 0

    rest = start_instance(
        configs[1],
        "g1",
        "removal_app",
        env={"REMOVAL_DECLARES": "rm-tally"},
        log=tmp_path / "g1.log",
    )
    settings = load_settings(configs[2], environ={})

    def verdict() -> str:
        report = health_report(nodes[2], settings, "rm-stock")
        return str(report["consumers"][0]["verdict"])

    wait_until(lambda: verdict() == "undeclared", timeout=60, what="rm-stock undeclared")
    removed = remove(nodes[2], "rm-stock", who="test", reason="galera", drop_tables=True)
    assert removed["dropped"] == ["rm_stock"]
    wait_until(lambda: _rows(nodes[0], "rm-stock") == 0, timeout=10, what="the rows gone on node 0")
    with nodes[0].read() as conn:
        assert not inspect(conn).has_table(app.stock.name)
    assert stop_instance(rest) == 0
    for db in nodes:
        db.dispose()
