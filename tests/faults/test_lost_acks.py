"""Lost COMMIT acknowledgements, one at a time, on demand: the proxy lets a COMMIT reach
MariaDB and commit, then cuts the connection before its answer reaches the framework.
Each test compares the effects with the sequential model: everything once, in order.

(MariaDB only: SQLite cannot lose an acknowledgement, see ``tests/faults/conftest.py``.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import fault_app
import pytest
from ack_proxy import AckProxy
from clusters import consumer_worker, wait_until
from fault_model import append_numbered, tally

from messaging import Database
from messaging.membership import InstanceInfo, Membership
from messaging.ownership import Ownership

pytestmark = [pytest.mark.faults, pytest.mark.mysql]
STALE = 30.0


def touches_checkpoints(statements: Sequence[str]) -> bool:
    """A transaction that moves a checkpoint: a batch's commit."""
    return any("consumer_partitions" in s and "SET checkpoint" in s for s in statements)


def _instance(db: Database, instance_id: str) -> None:
    with db.transaction() as conn:
        Membership(db).register(
            conn, InstanceInfo(id=instance_id, name=instance_id, host="fault-host", pid=1)
        )


def _worker(db: Database, proxied: Database, cls: type, instance_id: str = "fault-1") -> Any:
    """A worker of ``cls`` talking through the proxy, holding every partition."""
    _instance(db, instance_id)
    worker = consumer_worker(proxied, cls, instance_id=instance_id)
    ownership = Ownership(db)
    with db.transaction() as conn:
        ownership.ensure_partitions(conn, worker.spec.name, worker.spec.partitions)
        claims = ownership.claim(
            conn,
            worker.spec.name,
            range(worker.spec.partitions),
            instance_id,
            Membership(db).live_ids(STALE),
        )
    worker.add_claims(claims)
    return worker


def _drive(worker: Any, done: Callable[[], bool], what: str) -> None:
    """Poll like the worker's loop does (an error is logged, then polling goes on)."""

    def step() -> bool:
        try:
            worker.poll()
        except Exception:
            logging.getLogger(__name__).exception("poll failed")
        return done()

    wait_until(step, timeout=30, what=what)


def _checkpoints(db: Database, consumer: str) -> int:
    with db.read() as conn:
        return sum(r.checkpoint for r in Ownership(db).partitions(conn, [consumer]))


def test_projection_batch_whose_ack_is_lost_is_applied_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    worker = _worker(db, proxied, fault_app.SingleSequence)
    sources = [f"s{i}" for i in range(6)]
    append_numbered(db, sources, 1, 5)
    proxy.arm(1, when=touches_checkpoints)
    _drive(worker, lambda: proxy.armed == 0 and _checkpoints(db, "fault-seq-single") > 0, "a batch")
    append_numbered(db, sources, 6, 5)
    _drive(worker, lambda: tally(db, "fault-seq-single", {}).applied >= 60, "the rest")
    result = tally(db, "fault-seq-single", dict.fromkeys(sources, 10))
    assert proxy.dropped == 1
    assert result.exact, result
    assert result.applied == 60
