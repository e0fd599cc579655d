"""Waiting on what a consumer holds back (``on-failure: park-source``): its checkpoint passes
a parked source's messages without applying them, so a wait on them must not answer
"applied". Refused while the source is parked (only an operator helps), behind while it
is retried, applied once the retry applied them; a skipped position is refused for good
unless an operator retries it. Both backends, through the worker of a real consumer."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from clusters import wait_until
from parking_app import BROKEN, applied, drain, items_table, parking_worker, reclaim, same_partition
from poison_item import Item
from sqlalchemy import Table

from messaging import Appended, ConsistencyToken, Database, MessageStore, WaitRefused, wait_for
from messaging.waits._watcher import watcher_for
from projections import _parked_ops

CONSUMER = "parked-items"


@pytest.fixture
def table(db: Database) -> Iterator[Table]:
    with items_table(db) as table:
        yield table


def _append(db: Database, source: str, name: str) -> Appended:
    with db.transaction() as conn:
        return MessageStore(db).append(conn, "items", source, [Item(name)])


def _applied(db: Database, token: ConsistencyToken) -> bool:
    return wait_for(db, token, CONSUMER, fail_fast=True).applied


def test_a_wait_on_a_parked_sources_message_is_refused_until_a_retry_applies_it(
    db: Database, table: Table
) -> None:
    worker = parking_worker(db, table)
    a, b = same_partition(2)
    _append(db, a, "a1")
    poison = _append(db, a, "poison-a2")
    later = _append(db, a, "a3")
    other = _append(db, b, "b1")  # same partition, another source: it goes on
    drain(worker)
    assert (a, "a3") not in applied(db, table)  # held back, the checkpoint past it

    assert _applied(db, other.token)
    for held in (poison, later):
        with pytest.raises(
            WaitRefused,
            match=rf"holds back source '{a}', parked at position .*"
            rf"\(projections retry {CONSUMER} --source {a}\)$",
        ):
            wait_for(db, held.token, CONSUMER, timeout=5)
    with pytest.raises(WaitRefused, match="cannot handle poison-a2"):
        wait_for(db, (other.token | later.token), CONSUMER, timeout=5)

    BROKEN.clear()  # the handler is fixed; an operator retries the source
    _parked_ops.retry(db, CONSUMER, source=a, who="test")
    reclaim(db, worker)
    progress = wait_for(db, later.token, CONSUMER, fail_fast=True)
    [behind] = progress.behind
    assert behind.state == f"source {a!r} retrying from position {poison[0]}"
    drain(worker)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "poison-a2", "a3"]
    assert _applied(db, later.token) and _applied(db, poison.token)


def test_a_wait_started_during_a_retry_ends_when_the_retry_applies_not_at_its_deadline(
    db: Database, table: Table
) -> None:
    """A retry applies held messages behind the checkpoints: nothing the shared watcher's
    round reads moves but the parked rows, so they are part of what it compares."""
    worker = parking_worker(db, table)
    [a] = same_partition(1)
    _append(db, a, "poison-a1")
    later = _append(db, a, "a2")
    drain(worker)
    BROKEN.clear()
    _parked_ops.retry(db, CONSUMER, source=a, who="test")
    reclaim(db, worker)
    ended = threading.Event()
    results: list[bool] = []

    def wait() -> None:
        results.append(wait_for(db, later.token, CONSUMER, timeout=120).applied)
        ended.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    watcher = watcher_for(db)
    wait_until(lambda: watcher.rounds >= 2, timeout=30, what="the wait's first check")
    assert not ended.is_set()
    drain(worker)
    assert ended.wait(60), "the wait did not see the retry's apply (its deadline is 120 s)"
    assert results == [True]


def test_a_wait_on_a_skipped_message_is_refused_and_the_rest_of_its_source_applies(
    db: Database, table: Table
) -> None:
    worker = parking_worker(db, table)
    [a] = same_partition(1)
    poison = _append(db, a, "poison-a1")
    later = _append(db, a, "a2")
    drain(worker)
    _parked_ops.skip(db, CONSUMER, source=a, who="op-jane")  # skip the head, retry the rest
    reclaim(db, worker)
    drain(worker)
    assert applied(db, table) == [(a, "a2")]
    assert _applied(db, later.token)
    with pytest.raises(
        WaitRefused,
        match=r"skipped position \d+ \(op-jane skipped it\): .* an operator retries "
        rf"it \(projections retry {CONSUMER} --source {a} --skipped\)$",
    ):
        wait_for(db, poison.token, CONSUMER, timeout=5)
