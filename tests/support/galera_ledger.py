"""Ledger traffic and checks on a Galera cluster, shared by tests/galera and the benchmark:
a scratch database on the cluster, JSON lines for ``projections append``, and the read
model compared with the replay on every node."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql
from clusters import ledger_matches_replay, write_config
from galera_cluster import GaleraCluster
from sqlalchemy import func, select

from messaging import Database
from messaging._messages import registry
from messaging._settings import ConsumerSettings
from messaging.store._migrations import migrate
from projections._reports import consumers_report
from projections.examples import ledger

MOVED = "now using 127.0.0.1:"
"""What an instance logs when it moves to another node."""
FAST = ConsumerSettings(stale_instance_timeout=1.0, rebalance_interval=0.3, heartbeat_interval=0.2)
"""The timings of the instances' configuration (tests/support/clusters.py)."""


@contextmanager
def cluster_database(cluster: GaleraCluster, prefix: str = "g_") -> Iterator[str]:
    """A fresh, migrated database on the cluster, dropped afterwards; yields its name."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    _execute(cluster, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    db = Database(cluster.multi_url(name))
    try:
        migrate(db)
        db.prepare()
        db.dispose()
        _applied_everywhere(cluster, name, db.schema.positions.name)
        yield name
    finally:
        db.dispose()
        _execute(cluster, f"DROP DATABASE IF EXISTS `{name}`")


def instance_config(path: Path, url: str, **options: Any) -> Path:
    """:func:`clusters.write_config` (``options`` are its own) of an instance on the cluster
    at ``url``: one node, or a failover list."""
    db = Database(url)
    try:
        return write_config(path, db, **options)
    finally:
        db.dispose()


def _applied_everywhere(cluster: GaleraCluster, name: str, table: str) -> None:
    """Wait until every live node has applied the database's set-up (a causal read on
    each): a test writing through another node than the one that prepared it would
    otherwise find the tenant's position counter missing there for a moment."""
    for node in range(cluster.size):
        if cluster.running(node):
            conn = pymysql.connect(host="127.0.0.1", port=cluster.sql_ports[node], user="root")
            try:
                with conn.cursor() as cursor:
                    cursor.execute("SET SESSION wsrep_sync_wait = 1")
                    cursor.execute(f"SELECT COUNT(*) FROM `{name}`.`{table}`")
            finally:
                conn.close()


def _execute(cluster: GaleraCluster, sql: str) -> None:
    for node in range(cluster.size):  # the first live node; DDL replicates to the others
        if cluster.running(node):
            conn = pymysql.connect(host="127.0.0.1", port=cluster.sql_ports[node], user="root")
            try:
                with conn.cursor() as cursor:
                    cursor.execute(sql)
            finally:
                conn.close()
            return


def ledger_lines(path: Path, *, seed: int, messages: int, prefix: str) -> int:
    """Write about ``messages`` ledger messages (accounts ``prefix-N``) as JSON lines for
    ``projections append``; return how many lines."""
    lines = []
    for command in ledger.traffic(seed, messages, accounts=50, prefix=prefix):
        for source, event in command:
            type_name, payload = registry.encode(event)
            lines.append(
                json.dumps(
                    {
                        "topic": ledger.TOPIC,
                        "source": source,
                        "type": type_name,
                        "payload": json.loads(payload),
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def message_count(db: Database) -> int:
    """How many messages the tenant has."""
    m = db.schema.messages
    with db.read() as conn:
        return int(conn.execute(select(func.count()).where(m.c.tenant == db.tenant)).scalar_one())


def every_node_matches_replay(cluster: GaleraCluster, name: str) -> list[Any]:
    """On each node: (read model, replay) of the ledger; empty while a node differs."""
    results = []
    for node in range(cluster.size):
        db = Database(cluster.url(node, name))
        try:
            stored, expected = ledger_matches_replay(db)
        finally:
            db.dispose()
        if stored != expected:
            return []
        results.append(stored)
    return results


def checkpoints(db: Database, name: str) -> dict[tuple[int, int], int]:
    """(partition, epoch) → checkpoint of the partitions ``name`` owns (OWNED)."""
    report = consumers_report(db, FAST)
    return {
        (p["partition"], p["epoch"]): int(p["checkpoint"])
        for entry in report["consumers"]
        if entry["name"] == "ledger-balances"
        for p in entry["partitions"]
        if p["instance"] == name and p["state"] == "OWNED"
    }


def applying(
    db: Database, name: str, since: dict[tuple[int, int], int] | None = None
) -> Callable[[], bool]:
    """A condition: ``name`` has checkpointed a partition since the previous call (under
    the same claim: the same epoch), or for the first call since ``since`` (its
    :func:`checkpoints` taken before a fault: an instance that caught up before the first
    call has applied too)."""
    seen: dict[tuple[int, int], int] = dict(since or {})

    def advanced() -> bool:
        now = checkpoints(db, name)
        moved = any(c > seen[key] for key, c in now.items() if key in seen)
        seen.clear()
        seen.update(now)
        return moved

    return advanced
