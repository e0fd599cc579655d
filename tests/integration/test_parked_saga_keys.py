"""Which messages a saga parks under its instance (both backends): a failing message whose
source is its correlation key parks that instance; one of another source names no
instance to park, and halts its partition."""

from __future__ import annotations

import parked_saga_app as app
from clusters import consumer_worker
from parking_app import ME, claimed, drain, parked
from sqlalchemy import select

from messaging import Database, MessageStore
from messaging._states import PartitionStatus
from messaging.distribution._ownership import Ownership
from messaging.store._rows import partition_of
from sagas import SagaContext, SagaWorker, saga, start


@saga("park-keyed", topics="keyed", correlate_by="trip_id", state=app.Trip, partitions=2)
class Keyed:
    @start
    def leg(self, leg: app.Leg, ctx: SagaContext) -> None:
        if leg.poison:
            raise ValueError(f"leg {leg.seq} of {leg.trip_id} is poison")
        ctx.state = ctx.state or app.Trip()
        ctx.state.legs += 1


def test_a_saga_parks_an_instance_by_its_own_source_and_halts_on_another(db: Database) -> None:
    worker = create_worker(db)
    parks, halts, other, stray = [f"t{n}" for n in range(100) if partition_of(f"t{n}", 2) == 0][:4]
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "keyed", parks, [app.Leg(parks, 1, poison=True)])
        store.append(conn, "keyed", other, [app.Leg(other, 1)])
        store.append(conn, "keyed", stray, [app.Leg(halts, 1, poison=True)])  # not its key
    drain(worker)
    assert set(parked(db, "park-keyed")) == {parks}
    with db.read() as conn:
        [row] = [r for r in Ownership(db).partitions(conn, ["park-keyed"]) if r.partition == 0]
        started = set(conn.execute(select(db.schema.sagas.c.saga_key)).scalars())
    assert row.status == PartitionStatus.HALTED
    assert started == {other}


def create_worker(db: Database) -> SagaWorker:
    worker: SagaWorker = consumer_worker(
        db, Keyed, instance_id=ME, worker_class=SagaWorker, max_parked=10
    )
    claimed(db, worker)
    return worker
