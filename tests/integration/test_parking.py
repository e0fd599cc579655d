"""``on-failure: park-source``: a failing message parks its source; the partition goes on.

Worker-level tests on both backends: the parked source's messages are held back in
order, the other sources of the same partition are applied, the parked set survives a
new claim (a handover), a retry applies the held messages once in their order, and one
failing source too many halts the partition.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from clusters import consumer_worker
from poison_item import Item
from sqlalchemy import BigInteger, Column, MetaData, String, Table, insert, select, update

from messaging import Database, HandlerContext, MessageStore, handler
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Claim, Ownership
from messaging.runtime._parking import RETRYING, Parking
from messaging.runtime._worker import ConsumerWorker
from messaging.store._rows import partition_of
from projections import projection

ME = "me-4f3c"
BROKEN: set[str] = set()
"""Item names the handler fails on (a test "fixes" the handler by emptying it)."""


def _same_partition(count: int, partition: int = 0) -> list[str]:
    return [f"s{n}" for n in range(1000) if partition_of(f"s{n}", 2) == partition][:count]


@pytest.fixture
def table(db: Database) -> Iterator[Table]:
    table = Table(
        f"{db.schema.prefix}parked_items",
        MetaData(),
        Column("position", BigInteger, primary_key=True, autoincrement=False),
        Column("source", String(50), nullable=False),
        Column("name", String(50), nullable=False),
    )
    with db.transaction() as conn:
        table.create(conn)
    BROKEN.clear()
    BROKEN.add("poison")
    yield table
    BROKEN.clear()
    with db.transaction() as conn:
        table.drop(conn)


def _worker(
    db: Database, table: Table, max_sources: int = 10, *, first: bool = True
) -> ConsumerWorker:
    @projection("parked-items", topics="items", partitions=2, tables=[table])
    class Items:
        @handler
        def item(self, event: Item, ctx: HandlerContext) -> None:
            if event.name.split("-")[0] in BROKEN:
                raise ValueError(f"cannot handle {event.name}")
            row = {"position": ctx.envelope.position, "source": ctx.envelope.source}
            ctx.execute(insert(table), {**row, "name": event.name})

    worker: ConsumerWorker = consumer_worker(db, Items, instance_id=ME, instance_name="me")
    worker.parking = Parking(db, "parked-items", max_sources)
    if not first:  # another worker of the same instance: claims again (a handover)
        _reclaim(db, worker)
        return worker
    with db.transaction() as conn:
        Membership(db).register(conn, InstanceInfo(id=ME, name="me", host="h", pid=1))
        Ownership(db).ensure_partitions(conn, "parked-items", 2)
        claims = Ownership(db).claim(conn, "parked-items", [0, 1], ME, Membership(db).live_ids(30))
    worker.add_claims(claims)
    return worker


def _append(db: Database, *items: tuple[str, str]) -> dict[str, int]:
    """Append (source, name) pairs in this order; return each name's position."""
    store, positions = MessageStore(db), {}
    with db.transaction() as conn:
        for source, name in items:
            [positions[name]] = store.append(conn, "items", source, [Item(name)])
    return positions


def _drain(worker: ConsumerWorker) -> None:
    while worker.poll():
        pass


def _applied(db: Database, table: Table) -> list[tuple[str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(table.c.source, table.c.name).order_by(table.c.position))
        return [(r.source, r.name) for r in rows]


def _parked(db: Database) -> dict[str, tuple[int, str, str]]:
    t = db.schema.parked
    with db.read() as conn:
        return {
            r.source: (r.position, r.state, r.error)
            for r in conn.execute(select(t).where(t.c.consumer == "parked-items"))
        }


def _partition(db: Database, partition: int) -> tuple[str, int]:
    with db.read() as conn:
        [row] = [
            r for r in Ownership(db).partitions(conn, ["parked-items"]) if r.partition == partition
        ]
    return row.status, row.checkpoint


def _reclaim(db: Database, worker: ConsumerWorker) -> None:
    """What an operator's command does to the partitions (a new epoch), then the claim."""
    with db.transaction() as conn:
        t = db.schema.partitions
        conn.execute(update(t).where(t.c.consumer == "parked-items").values(owner=None))
        claims = Ownership(db).claim(conn, "parked-items", [0, 1], ME, Membership(db).live_ids(30))
    worker.drop([0, 1])
    worker.add_claims(claims)


def test_a_failing_message_parks_its_source_and_the_partition_goes_on(
    db: Database, table: Table
) -> None:
    worker = _worker(db, table)
    a, b = _same_partition(2)
    [c] = _same_partition(1, partition=1)
    pos = _append(
        db,
        (a, "a1"),
        (b, "b1"),
        (a, "poison-a2"),
        (c, "c1"),
        (b, "b2"),
        (a, "a3"),
        (b, "b3"),
    )
    _drain(worker)
    assert _applied(db, table) == [(a, "a1"), (b, "b1"), (c, "c1"), (b, "b2"), (b, "b3")]
    position, state, error = _parked(db)[a]
    assert (position, state) == (pos["poison-a2"], "parked")
    assert "cannot handle poison-a2" in error
    assert _partition(db, 0) == ("running", pos["b3"])  # past the held messages

    # Later messages of the parked source are held back too; the others still flow.
    more = _append(db, (a, "a4"), (b, "b4"))
    _drain(worker)
    assert _applied(db, table)[-1] == (b, "b4")
    assert (a, "a4") not in _applied(db, table)
    assert _partition(db, 0) == ("running", more["b4"])


def test_the_parked_set_survives_a_new_claim_and_a_retry_applies_once_in_order(
    db: Database, table: Table
) -> None:
    worker = _worker(db, table)
    a, b = _same_partition(2)
    _append(db, (a, "a1"), (a, "poison-a2"), (b, "b1"), (a, "a3"))
    _drain(worker)
    # A new worker (another instance after a handover) holds the source back too.
    BROKEN.clear()
    other = _worker(db, table, first=False)
    _append(db, (a, "a4"), (b, "b2"))
    _drain(other)
    assert _applied(db, table) == [(a, "a1"), (b, "b1"), (b, "b2")]

    with db.transaction() as conn:
        t = db.schema.parked
        conn.execute(update(t).values(state=RETRYING))
    _reclaim(db, other)
    _drain(other)
    assert [n for s, n in _applied(db, table) if s == a] == ["a1", "poison-a2", "a3", "a4"]
    assert _parked(db) == {}
    _append(db, (a, "a5"))
    _drain(other)
    assert _applied(db, table)[-1] == (a, "a5")
    assert len(_applied(db, table)) == 7  # each once


def test_a_retry_that_fails_again_applies_up_to_it_and_parks_there(
    db: Database, table: Table
) -> None:
    worker = _worker(db, table)
    [a] = _same_partition(1)
    pos = _append(db, (a, "poison-1"), (a, "x2"), (a, "broken-3"), (a, "x4"))
    _drain(worker)
    BROKEN.clear()
    BROKEN.add("broken")
    with db.transaction() as conn:
        conn.execute(update(db.schema.parked).values(state=RETRYING))
    _reclaim(db, worker)
    _drain(worker)
    assert [n for _, n in _applied(db, table)] == ["poison-1", "x2"]
    position, state, error = _parked(db)[a]
    assert (position, state) == (pos["broken-3"], "parked") and "broken-3" in error


def test_one_parked_source_too_many_halts_the_partition(db: Database, table: Table) -> None:
    worker = _worker(db, table, max_sources=1)
    a, b, c = _same_partition(3)
    pos = _append(db, (a, "poison-a"), (b, "b1"), (c, "poison-c"), (b, "b2"))
    _drain(worker)
    assert set(_parked(db)) == {a}
    assert _applied(db, table) == [(b, "b1")]
    assert _partition(db, 0) == ("halted", pos["poison-c"] - 1)


def test_nothing_parked_reads_no_source_column(db: Database, table: Table) -> None:
    """Free when nothing is parked: the batch read is the same statement as without the
    feature (no source column), and a partition with a parked source reads it."""
    worker = _worker(db, table)
    assert worker.parking is not None
    claims: dict[int, Claim] = worker.claims()
    assert worker.parking.held(claims) == {}
    [a] = _same_partition(1)
    _append(db, (a, "x1"))
    with db.read() as conn:
        assert len(worker._fetch(conn, claims)[0]) == 3  # position, type, payload
    _append(db, (a, "poison-2"))
    _drain(worker)
    with db.read() as conn:
        rows = worker._fetch(conn, {p: attrs_claim(c) for p, c in claims.items()})
    assert rows and len(rows[0]) == 5  # with the partition hash and the source


def attrs_claim(claim: Claim) -> Claim:
    return Claim(partition=claim.partition, epoch=claim.epoch, checkpoint=0)
