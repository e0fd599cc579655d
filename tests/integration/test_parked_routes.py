"""A route consumer parks by its key; with the idempotency guard, nothing is sent twice
through a retry and a skip, and an at-least-once sender's duplicate is still handled once
(both backends)."""

from __future__ import annotations

import attrs
from clusters import consumer_worker
from parking_app import BROKEN, ME, claimed, drain, parked, reclaim
from sqlalchemy import select

from messaging import Database, HandlerContext, MessageStore, handler, message, route_consumer
from messaging.applying._worker import ConsumerWorker
from messaging.routing._consumer import IdempotentWorker
from messaging.store._rows import partition_of
from projections import _parked_ops as ops


@message("test-parked-routes.job")
@attrs.define(frozen=True)
class Job:
    name: str


@route_consumer("park-jobs", partitions=2, idempotent=True)
class Jobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        if job.name.split("-")[0] in BROKEN:
            raise ValueError(f"cannot run {job.name}")
        ctx.send("park-results", Job(job.name), key=job.name)


def _worker(db: Database) -> ConsumerWorker:
    worker = consumer_worker(db, Jobs, instance_id=ME, worker_class=IdempotentWorker, max_parked=10)
    return claimed(db, worker)


def _send(db: Database, *jobs: tuple[str, str]) -> None:
    """Send (key, job name) pairs, each with the message id ``id-<name>``."""
    store = MessageStore(db)
    with db.transaction() as conn:
        for key, name in jobs:
            store.send(conn, "park-jobs", Job(name), key=key, message_id=f"id-{name}")


def _results(db: Database) -> list[str]:
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(
            select(m.c.source).where(m.c.topic == "park-results").order_by(m.c.position)
        )
        return list(rows.scalars())


def test_a_route_consumer_parks_its_key_and_sends_each_result_once(db: Database) -> None:
    BROKEN.clear()
    BROKEN.add("poison")
    try:
        k1, k2, k3 = [f"k{n}" for n in range(100) if partition_of(f"k{n}", 2) == 0][:3]
        worker = _worker(db)
        _send(db, (k1, "j1"), (k1, "poison-j2"), (k2, "j3"), (k1, "j4"), (k3, "poison-j5"))
        _send(db, (k1, "j4"), (k3, "j6"))  # an at-least-once sender: j4 again, same id
        drain(worker)
        assert _results(db) == ["j1", "j3"]
        assert set(parked(db, "park-jobs")) == {k1, k3}

        BROKEN.clear()
        ops.retry(db, "park-jobs", source=k1, who="ops@host")
        ops.skip(db, "park-jobs", source=k3, who="ops@host")
        reclaim(db, worker)
        drain(worker)
        _send(db, (k1, "j7"))
        drain(worker)
        # k1 in its order, j4 once; k3's skipped job never ran, the next one did
        assert _results(db) == ["j1", "j3", "poison-j2", "j4", "j6", "j7"]
        assert parked(db, "park-jobs") == {}
    finally:
        BROKEN.clear()
