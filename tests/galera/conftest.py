"""A 3-node MariaDB Galera cluster on loopback, started once for the session (about 10 s)
and destroyed at its end; each test gets a fresh database on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from galera_cluster import GCOMM_OFFSETS, SQL_OFFSETS, GaleraCluster, free_port_base
from galera_ledger import cluster_database


@pytest.fixture(scope="session")
def galera(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GaleraCluster]:
    """The session's cluster (ports chosen free, so a developer's cluster can keep running)."""
    cluster = GaleraCluster(
        tmp_path_factory.mktemp("galera"),
        sql_port=free_port_base(24406, SQL_OFFSETS),
        gcomm_port=free_port_base(24567, GCOMM_OFFSETS),
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def galera_db(galera: GaleraCluster) -> Iterator[str]:
    """The name of a fresh, migrated database on the cluster; every node back in the
    cluster and synced before the test starts (a test may kill one, or end while one is
    still rejoining)."""
    for node in range(galera.size):
        if not galera.running(node):
            galera.restart_node(node)
    for node in range(galera.size):
        galera.wait_rejoined(node)
    with cluster_database(galera) as name:
        yield name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n``, every Galera test runs on one worker (one cluster)."""
    for item in items:
        if item.get_closest_marker("galera") is not None:
            item.add_marker(pytest.mark.xdist_group("galera"))
