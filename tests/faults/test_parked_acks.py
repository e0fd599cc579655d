"""Lost COMMIT acknowledgements of a park and of a retry (MariaDB, through the proxy): the
worker re-reads its claims and their parked sources, so a park that went through holds
its source back, and a retry that went through is not applied again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ack_proxy import AckProxy, TransactionFilter
from parking_app import (
    BROKEN,
    append,
    applied,
    items_table,
    parked,
    parking_worker,
    reclaim,
    same_partition,
)
from sqlalchemy import Table

from messaging import Database
from messaging.applying._worker import ConsumerWorker
from projections import _parked_ops as ops

pytestmark = [pytest.mark.faults, pytest.mark.mysql]


def _touches(fragment: str) -> TransactionFilter:
    return lambda statements: any(fragment in s for s in statements)


@pytest.fixture
def table(db: Database) -> Iterator[Table]:
    with items_table(db) as table:
        yield table


def _drain(worker: ConsumerWorker) -> None:
    """Poll as the loop does: an error of unknown outcome is raised, then polling goes on."""
    for _ in range(20):
        try:
            if not worker.poll():
                return
        except Exception:
            continue


def test_a_park_whose_ack_is_lost_holds_its_source_back(
    db: Database, proxied: Database, proxy: AckProxy, table: Table
) -> None:
    worker = parking_worker(db, table, via=proxied)
    a, b = same_partition(2)
    proxy.arm(1, when=_touches("parked_sources"))
    append(db, (a, "a1"), (a, "poison-a2"), (b, "b1"), (a, "a3"))
    _drain(worker)
    assert proxy.armed == 0, "no acknowledgement was lost"
    append(db, (a, "a4"), (b, "b2"))
    _drain(worker)
    assert applied(db, table) == [(a, "a1"), (b, "b1"), (b, "b2")]  # once each, a held
    assert set(parked(db)) == {a}


def test_a_retry_whose_ack_is_lost_applies_each_message_once(
    db: Database, proxied: Database, proxy: AckProxy, table: Table
) -> None:
    worker = parking_worker(db, table, via=proxied)
    a, b = same_partition(2)
    append(db, (a, "a1"), (a, "poison-a2"), (b, "b1"), (a, "a3"))
    _drain(worker)
    BROKEN.clear()
    ops.retry(db, "parked-items", source=a, who="ops")
    reclaim(db, worker)
    proxy.arm(1, when=_touches("DELETE FROM"))  # the parked row deleted
    _drain(worker)
    assert proxy.armed == 0, "no acknowledgement was lost"
    append(db, (a, "a4"))
    _drain(worker)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "poison-a2", "a3", "a4"]
    assert parked(db) == {}
