"""``on-failure: park-source``: a failing message parks its source; the partition goes on.

Worker-level tests on both backends: the parked source's messages are held back in
order, the other sources of the same partition are applied, the parked set survives a
new claim (a handover), a retry applies the held messages once in their order, and one
failing source too many halts the partition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from parking_app import (
    BROKEN,
    append,
    applied,
    drain,
    items_table,
    make_table,
    parked,
    parking_worker,
    partition,
    reclaim,
    same_partition,
)
from sqlalchemy import Table, event, update

from messaging import Database
from messaging.distribution._ownership import Claim
from messaging.failures._parking import RETRYING
from messaging.store._rows import PARTITION_HASH, SOURCE


@pytest.fixture
def table(db: Database) -> Iterator[Table]:
    with items_table(db) as table:
        yield table


def test_a_failing_message_parks_its_source_and_the_partition_goes_on(
    db: Database, table: Table
) -> None:
    worker = parking_worker(db, table)
    a, b = same_partition(2)
    [c] = same_partition(1, partition=1)
    pos = append(
        db,
        (a, "a1"),
        (b, "b1"),
        (a, "poison-a2"),
        (c, "c1"),
        (b, "b2"),
        (a, "a3"),
        (b, "b3"),
    )
    drain(worker)
    assert applied(db, table) == [(a, "a1"), (b, "b1"), (c, "c1"), (b, "b2"), (b, "b3")]
    position, state, error = parked(db)[a]
    assert (position, state) == (pos["poison-a2"], "parked")
    assert "cannot handle poison-a2" in error
    assert partition(db, 0) == ("running", pos["b3"])  # past the held messages

    # Later messages of the parked source are held back too; the others still flow.
    more = append(db, (a, "a4"), (b, "b4"))
    drain(worker)
    assert applied(db, table)[-1] == (b, "b4")
    assert (a, "a4") not in applied(db, table)
    assert partition(db, 0) == ("running", more["b4"])


def test_the_parked_set_survives_a_new_claim_and_a_retry_applies_once_in_order(
    db: Database, table: Table
) -> None:
    worker = parking_worker(db, table)
    a, b = same_partition(2)
    append(db, (a, "a1"), (a, "poison-a2"), (b, "b1"), (a, "a3"))
    drain(worker)
    # A new worker (another instance after a handover) holds the source back too.
    BROKEN.clear()
    other = parking_worker(db, table, first=False)
    append(db, (a, "a4"), (b, "b2"))
    drain(other)
    assert applied(db, table) == [(a, "a1"), (b, "b1"), (b, "b2")]

    with db.transaction() as conn:
        t = db.schema.parked
        conn.execute(update(t).values(state=RETRYING))
    reclaim(db, other)
    drain(other)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "poison-a2", "a3", "a4"]
    assert parked(db) == {}
    append(db, (a, "a5"))
    drain(other)
    assert applied(db, table)[-1] == (a, "a5")
    assert len(applied(db, table)) == 7  # each once


def test_a_retry_that_fails_again_applies_up_to_it_and_parks_there(
    db: Database, table: Table
) -> None:
    worker = parking_worker(db, table)
    [a] = same_partition(1)
    pos = append(db, (a, "poison-1"), (a, "x2"), (a, "broken-3"), (a, "x4"))
    drain(worker)
    BROKEN.clear()
    BROKEN.add("broken")
    with db.transaction() as conn:
        conn.execute(update(db.schema.parked).values(state=RETRYING))
    reclaim(db, worker)
    drain(worker)
    assert [n for _, n in applied(db, table)] == ["poison-1", "x2"]
    position, state, error = parked(db)[a]
    assert (position, state) == (pos["broken-3"], "parked") and "broken-3" in error


def test_one_parked_source_too_many_halts_the_partition(
    db: Database, table: Table, caplog: pytest.LogCaptureFixture
) -> None:
    worker = parking_worker(db, table, max_sources=1)
    a, b, c = same_partition(3)
    pos = append(db, (a, "poison-a"), (b, "b1"), (c, "poison-c"), (b, "b2"))
    with caplog.at_level(logging.WARNING):
        drain(worker)
    [halt] = [r for r in caplog.records if "event=halt" in r.getMessage()]
    logged = logging.Formatter().format(halt)  # the handler's own error, no framework chain
    assert "cannot handle poison-c" in logged and "During handling" not in logged
    assert any("event=park-escalated" in r.getMessage() for r in caplog.records)
    assert set(parked(db)) == {a}
    assert applied(db, table) == [(b, "b1")]
    assert partition(db, 0) == ("halted", pos["poison-c"] - 1)


def test_nothing_parked_reads_no_source_column(db: Database, table: Table) -> None:
    """Free when nothing is parked: the batch read is the same statement as without the
    feature (no source column), and a partition with a parked source reads it."""
    worker = parking_worker(db, table)
    assert worker.parking is not None
    claims: dict[int, Claim] = worker.claims()
    assert worker.parking.held(claims) == {}
    [a] = same_partition(1)
    append(db, (a, "x1"))
    with db.read() as conn:
        assert len(worker._fetch(conn, claims)[0]) == PARTITION_HASH  # no hash, no source
    append(db, (a, "poison-2"))
    drain(worker)
    with db.read() as conn:
        rows = worker._fetch(conn, {p: attrs_claim(c) for p, c in claims.items()})
    assert rows and len(rows[0]) == SOURCE + 1  # with the partition hash and the source


def attrs_claim(claim: Claim) -> Claim:
    return Claim(partition=claim.partition, epoch=claim.epoch, checkpoint=0)


def _statements(path: Path, parking: bool) -> list[str]:
    """The statements a worker sends to SQLite while it applies 60 messages of 6 sources
    in batches (after its claim), with parking on (nothing parked) or off."""
    db = Database(f"sqlite:///{path}")
    db.prepare()
    sent: list[str] = []
    table = make_table(db)
    with db.transaction() as conn:
        table.create(conn)
    try:
        worker = parking_worker(db, table, max_sources=10 if parking else None)
        worker.settings = attrs.evolve(worker.settings, batch_size=7)
        append(db, *[(f"s{n % 6}", f"m{n}") for n in range(60)])
        db.engine.dispose()  # new connections, each tracing what it sends
        event.listen(
            db.engine,
            "connect",
            lambda dbapi, _record: dbapi.set_trace_callback(sent.append),
        )
        drain(worker)
    finally:
        db.dispose()
    return [s.split()[0] for s in sent]


def test_statements_per_batch_are_the_same_with_parking_on_and_nothing_parked(
    tmp_path: Path,
) -> None:
    BROKEN.clear()
    with_parking = _statements(tmp_path / "on.db", parking=True)
    without = _statements(tmp_path / "off.db", parking=False)
    assert with_parking == without
    assert with_parking.count("UPDATE") == 9  # 9 batches of 7, each a fenced checkpoint
