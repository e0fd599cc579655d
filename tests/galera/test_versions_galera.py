"""A rebuild and a rollback on a 3-node Galera cluster: instances on nodes 0 and 1 build
the new version, then the old one again from where it was retired, while traffic is
appended through node 2 and a reader queries node 1 every 10 ms. Each cutover's
``RENAME TABLE`` runs in total order on every node (aborting, as Galera does, a read
holding the table at that moment: retried): the reader never sees an empty, partly
built or older read model, and every node ends with version 1 live again and
equal to the replay (version 2 kept as ``_v2__ledger_balances``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusters import (
    cli,
    lag,
    live_version,
    owned_by,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
)
from galera_cluster import GaleraCluster
from galera_ledger import every_node_matches_replay, instance_config
from readers import Reader, Traffic
from sqlalchemy import inspect

from messaging import Database

pytestmark = [pytest.mark.galera, pytest.mark.mysql, pytest.mark.multiprocess]


def test_a_version_built_on_two_nodes_takes_over_and_rolls_back_on_every_node(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    through = Database(galera.url(2, galera_db))
    seed_ledger(through, 2000, seed=51)
    configs = {
        name: instance_config(tmp_path / f"{name}.yaml", galera.multi_url(galera_db, order))
        for name, order in [("on-node0", [0, 1, 2]), ("on-node1", [1, 2, 0])]
    }
    processes = [
        start_instance(path, name, log=tmp_path / f"{name}.log") for name, path in configs.items()
    ]
    reader = Reader(Database(galera.url(1, galera_db)), retry_aborts=True)
    traffic = Traffic(through)
    try:
        wait_until(lambda: owned_by(through, set(configs)), timeout=60, what="both to share")
        wait_until(lambda: lag(through) == 0, timeout=60, what="the first pass")
        reader.start()
        traffic.start()
        cli(configs["on-node0"], "rebuild", "ledger-balances", "--reason", "galera")
        wait_until(lambda: live_version(through) == 2, timeout=60, what="version 2 live")
        cli(configs["on-node1"], "rollback", "ledger-balances", "--reason", "galera")
        wait_until(lambda: live_version(through) == 1, timeout=60, what="version 1 live again")
        traffic.stop()
        wait_until(lambda: lag(through) == 0, timeout=60, what="the new version caught up")
        reader.stop()
    finally:
        traffic.stop()
        reader.stop()
        assert [stop_instance(process) for process in processes] == [0, 0]
    print(
        f"\nreads {reader.reads} on node 1, went back {reader.went_back}, "
        f"aborted by a rename {reader.aborted}, errors {reader.errors}"
    )
    assert reader.reads > 20 and reader.errors == [] and reader.went_back == 0
    assert reader.aborted <= 2  # one rename per cutover: at most one read each
    assert wait_until(
        lambda: every_node_matches_replay(galera, galera_db), timeout=30, what="every node"
    )
    for node in range(galera.size):
        db = Database(galera.url(node, galera_db))
        try:
            with db.read() as conn:
                tables = set(inspect(conn).get_table_names())
            assert live_version(db) == 1
        finally:
            db.dispose()
        assert {"ledger_balances", "_v2__ledger_balances"} <= tables, (node, tables)
        assert "_v1__ledger_balances" not in tables, (node, tables)
    through.dispose()
