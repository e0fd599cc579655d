"""A rolling deploy that changes a message's shape, on real ``projections run`` processes:
older instances never apply a payload they cannot read, nothing is skipped or halted,
and once the older instances stop everything is applied exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import shapes_tables
from clusters import lag, owned_by, owners, start_instance, stop_instance, wait_until, write_config
from shapes_app import write_generations
from shapes_tables import newer_sales, sales_count
from sqlalchemy import MetaData, select

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from messaging.distribution._ownership import Ownership
from messaging.store._rows import partition_of
from projections._reports import instances_report

pytestmark = pytest.mark.multiprocess

CONSUMER = "shop-sales"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [shapes_tables.metadata]


def test_a_rolling_deploy_to_a_newer_payload_version_never_misreads(
    db: Database, tmp_path: Path
) -> None:
    write_generations(db, times=2)  # 8 sales of three generations, before the deploy
    config = write_config(tmp_path / "config.yaml", db)
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "old2", "new1")}
    old = [start_instance(config, n, "shapes_app", log=logs[n]) for n in ("old1", "old2")]
    new = None
    try:
        wait_until(lambda: owned_by(db, {"old1", "old2"}, CONSUMER), timeout=60, what="old share")
        wait_until(lambda: sales_count(db) == 8, timeout=60, what="the old generations applied")
        new = start_instance(config, "new1", "shapes_newer_app", log=logs["new1"])
        wait_until(
            lambda: "new1" in {name for name, _ in owners(db, CONSUMER).values()},
            timeout=60,
            what="new1 to take a share",
        )
        report = instances_report(db, ConsumerSettings())
        reads = {i["name"]: i["reads"][CONSUMER] for i in report["instances"]}
        assert reads == {
            "old1": {"shop.order-placed": 2, "shop.sale": 2},
            "old2": {"shop.order-placed": 2, "shop.sale": 2},
            "new1": {"shop.order-placed": 3, "shop.sale": 3},
        }
        older = [
            "rename 'shop.order-placed' -> 'shop.sale'",
            "upcaster shapes_tables.split_customer_name ('shop.order-placed' v1 -> "
            "'shop.order-placed' v2)",
        ]
        upcasters = {i["name"]: i["upcasters"][CONSUMER] for i in report["instances"]}
        assert upcasters == {
            "old1": older,
            "old2": older,
            "new1": sorted(
                [*older, "upcaster shapes_newer_app.to_cents ('shop.sale' v2 -> 'shop.sale' v3)"]
            ),
        }
        [old1] = [i for i in report["instances"] if i["name"] == "old1"]
        saga_state = "upcaster shapes_app.rename_score ('saga-state:shop-loyalty' v1 -> "
        assert any(u.startswith(saga_state) for u in old1["upcasters"]["shop-loyalty"])
        newer = newer_sales(16)
        assert len({partition_of(m.source, 4) for m in newer}) == 4
        with db.transaction() as conn:
            MessageStore(db).append_encoded(conn, newer)
        write_generations(db, times=1, first=2)  # an older producer still writes too
        wait_until(lambda: sales_count(db) == 8 + 16 + 4, timeout=60, what="every sale applied")
        wait_until(lambda: lag(db, CONSUMER) == 0, timeout=60, what="no lag")
        # The older instances hold only partitions with nothing newer left to read.
        with db.read() as conn:
            parts = Ownership(db).partitions(conn, [CONSUMER])
        assert {p.status for p in parts} == {"running"}
        for process in old:
            assert stop_instance(process) == 0
        wait_until(lambda: owned_by(db, {"new1"}, CONSUMER), timeout=60, what="new1 alone")
        assert lag(db, CONSUMER) == 0
    finally:
        for process in [*old, *([new] if new else [])]:
            if process.poll() is None:
                stop_instance(process)
    with db.read() as conn:
        rows = conn.execute(select(shapes_tables.sales)).mappings().all()
    applied = {r["order_id"]: r["amount"] for r in rows}
    assert len(rows) == 28
    assert all(applied[f"n{i}"] == 100 + i for i in range(16))
    said = [logs[n].read_text() for n in ("old1", "old2")]
    stops = sum(
        text.count("needs a newer declaration of type 'shop.sale' version 3") for text in said
    )
    assert stops >= 1, said  # an older instance met one, and said so
    assert "halt" not in "".join(said).lower()
    waits = [line for text in said for line in text.splitlines() if "no live instance has" in line]
    # new1 takes shop-sales' partitions; the sagas shop-customers and shop-loyalty, which
    # only the older app runs, wait for a newer declaration: each instance says so once
    # per partition (4 each)
    assert not [line for line in waits if "consumer shop-sales " in line]
    for text in said:
        lines = [line.split(": ", 1)[1] for line in text.splitlines() if "waits: it" in line]
        assert len(lines) == len(set(lines)) <= 8, lines
    assert "needs a newer" not in logs["new1"].read_text()


def test_mixed_code_under_a_stream_of_newer_payloads_moves_each_partition_once(
    db: Database, tmp_path: Path
) -> None:
    """Two instances on the older code, one on the newer, while newer payloads keep coming
    to every partition (a few every 50 ms for 4 s): each partition an older instance
    holds moves to the newer one once, when it first meets one, and stays there (it used
    to come back at the next rebalance and leave again at the next newer payload: epochs
    in the hundreds); each older instance says why in one line per cause a minute."""
    write_generations(db, times=1)
    config = write_config(tmp_path / "config.yaml", db)
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "old2", "new1")}
    old = [start_instance(config, n, "shapes_app", log=logs[n]) for n in ("old1", "old2")]
    new = start_instance(config, "new1", "shapes_newer_app", log=logs["new1"])
    seen: dict[int, list[str]] = {p: [] for p in range(4)}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            for partition, (name, _) in owners(db, CONSUMER).items():
                if name is not None and (not seen[partition] or seen[partition][-1] != name):
                    seen[partition].append(name)

    sampler = threading.Thread(target=sample)
    try:
        wait_until(
            lambda: {n for n, _ in owners(db, CONSUMER).values()} == {"old1", "old2", "new1"},
            timeout=60,
            what="the three instances to share shop-sales",
        )
        sampler.start()
        sent = 0
        for _ in range(80):  # 4 s of newer payloads, 4 at a time
            with db.transaction() as conn:
                MessageStore(db).append_encoded(conn, newer_sales(4, first=sent))
            sent += 4
            time.sleep(0.05)  # (the pace of the traffic, not a wait for anything)
        wait_until(lambda: sales_count(db) == 4 + sent, timeout=60, what="every sale applied")
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join()
        for process in [*old, new]:
            stop_instance(process)
    moves = {p: len(names) - 1 for p, names in seen.items()}
    assert all(m <= 1 for m in moves.values()), seen
    assert all(names[-1] == "new1" for names in seen.values()), seen
    for name in ("old1", "old2"):
        lines = [
            line
            for line in logs[name].read_text().splitlines()
            if f"consumer {CONSUMER} " in line and "is left to another" in line
        ]
        assert len(lines) <= 1, lines  # one cause: shop-sales cannot read shop.sale v3
