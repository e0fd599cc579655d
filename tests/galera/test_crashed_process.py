"""A crashed instance process on Galera, its node living on: named locks are local to a
node, so a peer connected to the same node sees the crash at once and takes over within a
second or two; a peer on another node cannot see it, and takes over after the stale
timeout, as before. (What a lost node costs is in test_galera.py and test_frozen_node.py.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from clusters import lag, owners, start_instance, stop_instance, wait_until
from galera_cluster import GaleraCluster
from galera_ledger import instance_config

from messaging import Database
from messaging.store._liveness import GONE

pytestmark = [pytest.mark.galera, pytest.mark.multiprocess]

STALE = 4.0
SETTINGS = {"stale-instance-timeout": "4s", "heartbeat-interval": "300ms"}


def _holders(db: Database) -> set[str]:
    """The names owning a partition, when every partition is OWNED (else empty)."""
    current = owners(db, stale=STALE)
    if not current or any(state != "OWNED" for _, state in current.values()):
        return set()
    return {str(name) for name, _ in current.values()}


def _takeover(db: Database, tmp_path: Path, galera: GaleraCluster, name: str, url: str) -> float:
    """Start ``name`` on ``url``, SIGKILL it once it owns a share; seconds until the
    survivor owns every partition again."""
    config = instance_config(tmp_path / f"{name}.yaml", url, consumer=SETTINGS)
    victim = start_instance(config, name, log=tmp_path / f"{name}.log")
    wait_until(lambda: _holders(db) == {"survivor", name}, timeout=60, what=f"{name} to share")
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(timeout=10)
    wait_until(lambda: _holders(db) == {"survivor"}, timeout=60, what="the takeover")
    return time.monotonic() - killed


def test_a_crash_is_seen_at_once_on_the_same_node_and_after_the_stale_timeout_across(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    db = Database(galera.url(0, galera_db))
    log = tmp_path / "survivor.log"
    config = instance_config(
        tmp_path / "survivor.yaml", galera.url(0, galera_db), consumer=SETTINGS
    )
    survivor = start_instance(config, "survivor", log=log)
    try:
        wait_until(lambda: _holders(db) == {"survivor"}, timeout=60, what="the survivor")
        same_node = [
            _takeover(db, tmp_path, galera, f"node0-{n}", galera.url(0, galera_db))
            for n in range(3)
        ]
        declared = log.read_text(encoding="utf-8").count(GONE)
        other_node = _takeover(db, tmp_path, galera, "node1", galera.url(1, galera_db))
        assert lag(db) is not None
    finally:
        assert stop_instance(survivor) == 0
        db.dispose()
    print(f"\nSIGKILL → owned again: same node {[round(t, 2) for t in same_node]} s, ", end="")
    print(f"another node {other_node:.2f} s (stale-instance-timeout {STALE:g} s)")
    assert declared == 3
    assert max(same_node) < 3.0
    assert other_node > STALE - 1.0  # its last heartbeat came up to an interval before
    assert log.read_text(encoding="utf-8").count(GONE) == 3  # nothing said of node1


def test_a_restarted_server_declares_nobody_gone(
    galera: GaleraCluster, galera_db: str, tmp_path: Path
) -> None:
    """Node 0 restarts under two instances connected to it alone: every named lock on it
    goes at once and comes back as each instance reconnects, and a peer trusts a freed
    lock only once its own was held for the confirmation window: nobody is declared gone,
    and both own a share again once the node is back."""
    url = galera.url(0, galera_db)
    db = Database(galera.url(1, galera_db))  # reports from a node that stays up
    settings = {"stale-instance-timeout": "60s", "heartbeat-interval": "300ms"}
    logs = [tmp_path / f"{name}.log" for name in ("a", "b")]
    instances = [
        start_instance(
            instance_config(tmp_path / f"{p.stem}.yaml", url, consumer=settings), p.stem, log=p
        )
        for p in logs
    ]
    try:
        wait_until(lambda: _holders(db) == {"a", "b"}, timeout=60, what="both to share")
        galera.stop_node(0)
        galera.restart_node(0)
        back = time.monotonic()
        wait_until(lambda: _holders(db) == {"a", "b"}, timeout=60, what="both to share again")
        again = time.monotonic() - back
    finally:
        codes = [stop_instance(p) for p in instances]
        db.dispose()
    declared = sum(p.read_text(encoding="utf-8").count(GONE) for p in logs)
    print(f"\nnode 0 restarted: both own a share {again:.2f} s after it is back; gone: {declared}")
    assert codes == [0, 0]
    assert declared == 0
