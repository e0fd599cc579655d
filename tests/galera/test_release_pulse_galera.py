"""A release moves the generation for the instance that waits for it only, on Galera:
each instance reads the pulse on its own node, and the changes and releases replicated
to it from the others count apart as on one server (the one-server test:
tests/integration/test_release_pulse.py)."""

from __future__ import annotations

from collections.abc import Callable

import fault_app
import pytest
from clusters import wait_until
from galera_cluster import GaleraCluster
from sqlalchemy import select

from messaging import Database, Instance, Settings, create_plugin_manager
from messaging._consumers import consumer_spec
from messaging.distribution._pulse import RELEASE, bump_generation, only_releases

pytestmark = [pytest.mark.galera, pytest.mark.mysql]

SEQUENCE = consumer_spec(fault_app.Sequence)  # 4 partitions
REPLICATED = 10.0
"""Seconds a change committed on one node may take to be read on another."""


def _instance(db: Database, name: str) -> Instance:
    hooks = create_plugin_manager([], load_entrypoints=False).hook
    instance = Instance(db, [SEQUENCE], Settings(), hooks, name=name)
    instance.start(loops=False)  # registered, declared, its first round run
    return instance


def _generation(db: Database) -> int:
    g = db.schema.generations
    with db.read() as conn:
        return int(conn.execute(select(g.c.generation).where(g.c.tenant == db.tenant)).scalar_one())


def _reads(db: Database, generation: int) -> Callable[[], bool]:
    """Whether ``db``'s node reads the tenant's generation as ``generation``."""
    return lambda: _generation(db) == generation


def test_a_release_on_one_node_wakes_only_the_instance_on_another_that_waits_for_it(
    galera: GaleraCluster, galera_db: str
) -> None:
    node0, node1, node2 = (Database(galera.url(n, galera_db)) for n in range(3))
    first = _instance(node0, "first")
    try:
        assert first.workers[SEQUENCE.name].claims().keys() == {0, 1, 2, 3}
        second = _instance(node1, "second")  # waits for half, held by first
        try:
            assert second.rebalancer.awaiting()
            # the join, committed on node 1, is a change: first plans again once it reads it
            wait_until(first.pulser.beat, timeout=REPLICATED, what="the join on node 0")
            first.rebalance()  # releases half to second, through node 0
            assert len(first.workers[SEQUENCE.name].claims()) == 2
            assert not first.pulser.beat()  # its own release: nothing for it
            wait_until(second.pulser.beat, timeout=REPLICATED, what="the release on node 1")
            second.rebalance()
            assert len(second.workers[SEQUENCE.name].claims()) == 2
            assert not second.rebalancer.awaiting()

            # a release committed on node 2, once both nodes read it: neither plans
            with node2.transaction() as conn:
                bump_generation(node2, conn, release=True)
            released = _generation(node2)
            for db in (node0, node1):
                wait_until(_reads(db, released), timeout=REPLICATED, what="the release replicated")
            assert released - (second.rebalancer.generation or 0) == RELEASE
            assert only_releases(first.rebalancer.generation, released)  # its own and this
            assert not first.pulser.beat() and not second.pulser.beat()
        finally:
            second.stop()
    finally:
        first.stop()
        for db in (node0, node1, node2):
            db.dispose()
