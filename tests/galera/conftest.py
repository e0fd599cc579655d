"""A 3-node MariaDB Galera cluster on loopback, started once for the session (about 10 s)
and destroyed at its end; each test gets a fresh database on it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from galera_cluster import GaleraCluster
from galera_ledger import cluster_database


def _free_base(start: int, offsets: list[int]) -> int:
    """The first port base from ``start`` (stepping 100) where every base+offset is free."""
    for base in range(start, start + 10_000, 100):
        try:
            for offset in offsets:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no free ports from {start}")


@pytest.fixture(scope="session")
def galera(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GaleraCluster]:
    """The session's cluster (ports chosen free, so a developer's cluster can keep running)."""
    cluster = GaleraCluster(
        tmp_path_factory.mktemp("galera"),
        sql_port=_free_base(24406, [0, 1, 2]),
        gcomm_port=_free_base(24567, [i + 10 * n for n in range(3) for i in range(3)]),
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def galera_db(galera: GaleraCluster) -> Iterator[str]:
    """The name of a fresh, migrated database on the cluster; every node back in the
    cluster before the test starts (a test may kill one)."""
    for node in range(galera.size):
        if not galera.running(node):
            galera.restart_node(node)
    with cluster_database(galera) as name:
        yield name
