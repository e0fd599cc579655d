"""The transfer saga of the example app on real processes, one of them killed with SIGKILL
part-way: every transfer ends (credited, or refunded at its deadline), the balances equal
a sequential model of the same traffic, and every transfer is notified exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusters import lag, start_instance, stop_instance, wait_until, write_config
from sqlalchemy import MetaData, func, select

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from projections._reports import instances_report
from projections.examples import ledger, transfers

pytestmark = pytest.mark.multiprocess

MODULES = ("projections.examples.ledger", "projections.examples.transfers")
CONSUMERS = ("ledger-balances", "ledger-transfers", "ledger-accounts", "ledger-notifications")


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [ledger.metadata, transfers.metadata]


def _append_traffic(db: Database, count: int) -> list[object]:
    store = MessageStore(db)
    appended: list[object] = []
    for command in transfers.traffic(seed=5, count=count, accounts=12):
        with db.transaction() as conn:
            for topic, source, event in command:
                store.append(conn, topic, source, [event])
                appended.append(event)
    return appended


def _ended_sagas(db: Database) -> int:
    t = db.schema.sagas
    with db.read() as conn:
        return int(
            conn.execute(
                select(func.count()).where(t.c.tenant == db.tenant, t.c.ended.is_(True))
            ).scalar_one()
        )


def _live(db: Database) -> set[str]:
    report = instances_report(db, ConsumerSettings(stale_instance_timeout=1.0))
    return {i["name"] for i in report["instances"] if i["live"]}


def _caught_up(db: Database) -> bool:
    return all(lag(db, consumer) == 0 for consumer in CONSUMERS)


def test_transfers_end_equal_to_a_sequential_model_across_a_sigkill(
    db: Database, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", db, batch_size=20)
    first = start_instance(config, "xfer-1", *MODULES)
    second = start_instance(config, "xfer-2", *MODULES)
    try:
        wait_until(lambda: lag(db, "ledger-transfers") == 0, timeout=30, what="the start")
        traffic = _append_traffic(db, 120)
        requested = sum(isinstance(m, transfers.TransferRequested) for m in traffic)
        wait_until(lambda: _ended_sagas(db) > 5, timeout=30, what="some transfers to end")
        first.kill()
        first.wait(timeout=10)
        assert _ended_sagas(db) < requested, "the kill came too late to be part-way"
        replacement = start_instance(config, "xfer-3", *MODULES)
        try:
            wait_until(lambda: "xfer-3" in _live(db), timeout=30, what="the replacement to join")
            wait_until(
                lambda: _ended_sagas(db) == requested and _caught_up(db),
                timeout=90,
                what="every transfer to end and every consumer to catch up",
            )
        finally:
            assert stop_instance(replacement) == 0
    finally:
        assert stop_instance(second) == 0

    with db.read() as conn:
        balances = ledger.read_model(conn.execute(select(ledger.balances)).mappings())
        notified = conn.execute(select(transfers.notifications.c.transfer_id)).scalars().all()
        events = [
            MessageStore(db).registry.decode(row.type, row.payload)
            for row in MessageStore(db).read(conn, [ledger.TOPIC], limit=1_000_000)
        ]
    assert balances == transfers.model(traffic)
    assert balances == ledger.replay(events)
    assert len(notified) == requested == len(set(notified))
    refunded = sum(isinstance(e, ledger.TransferRefunded) for e in events)
    assert 0 < refunded < requested  # both ways of ending were taken
