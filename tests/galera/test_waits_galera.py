"""Read your own writes on a 3-node Galera cluster, as the README's "On Galera" says to:
appenders write through node 2; they wait through node 1 and read the read model there
(the node they waited on), and on node 0 with ``wsrep_sync_wait=1`` (a causal read) on
the session. Instances spread over the nodes (their failover lists start at node 0, 1,
2 in turn) are SIGKILLed and replaced, joined and stopped, and the projection is rebuilt,
while they apply (tests/support/waiting_appenders.py; its size from the environment).
No wait answers "applied" before both reads show the write; every wait ends applied, or
refused/timed out with its reason; every account ends with exactly the deposits that
committed, on every node."""

from __future__ import annotations

from pathlib import Path

import pytest
from galera_cluster import GaleraCluster
from galera_ledger import instance_config
from instance_fleet import Fleet
from ryw_reads import Reading
from waiting_appenders import Places, Plan, check, run

from messaging import Database

pytestmark = [pytest.mark.galera, pytest.mark.mysql, pytest.mark.multiprocess]

ORDERS = [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
"""The failover lists of the instances' configurations, used in turn."""


def test_waits_on_one_node_read_there_and_causally_on_another_of_appends_on_a_third(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    plan = Plan.from_env()
    nodes = [Database(galera.url(node, galera_db)) for node in range(galera.size)]
    configs = [
        instance_config(
            tmp_path / f"order{i}.yaml", galera.multi_url(galera_db, order), batch_size=20
        )
        for i, order in enumerate(ORDERS)
    ]
    places = Places(
        writer=nodes[2],
        waiter=nodes[1],
        readings=(
            Reading("node 1 (the wait's node)", nodes[1]),
            Reading("node 0 (a causal read)", nodes[0], causal=True),
        ),
    )
    try:
        fleet = Fleet(nodes[2], configs, tmp_path, prefix="g")
        tally, wall = run(plan, places, fleet)
        check(plan, places, fleet, tally, wall, label="galera")
    finally:
        for db in nodes:
            db.dispose()
