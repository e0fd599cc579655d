"""`projections rebuild` on a running two-process cluster: a new version is built beside
the live one while the instances keep running, and takes over, equal to a sequential
replay."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusters import (
    cli,
    lag,
    ledger_matches_replay,
    live_version,
    owned_by,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)
from sqlalchemy import update

from messaging import Database
from projections.examples import ledger

pytestmark = pytest.mark.multiprocess


def test_rebuild_on_a_running_cluster_equals_a_sequential_replay(
    db: Database, tmp_path: Path
) -> None:
    """Corrupt the read model, rebuild from the CLI, and the cluster repairs it."""
    seed_ledger(db, 3000, seed=31)
    config = write_config(tmp_path / "config.yaml", db, batch_size=100)
    processes = [start_instance(config, name) for name in ("r1", "r2")]
    try:
        wait_until(lambda: owned_by(db, {"r1", "r2"}), timeout=60, what="r1 and r2 to share")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the first pass")
        with db.transaction() as conn:
            conn.execute(update(ledger.balances).values(balance=-1))
        assert ledger_matches_replay(db)[0] != ledger_matches_replay(db)[1]

        output = cli(config, "rebuild", "ledger-balances", "--reason", "corrupted")
        assert "rebuild of ledger-balances requested" in output
        wait_until(
            lambda: live_version(db) == 2 and lag(db) == 0 and owned_by(db, {"r1", "r2"}),
            timeout=60,
            what="the cluster to rebuild and catch up",
        )
        seed_ledger(db, 500, seed=32, prefix="after")
        wait_until(lambda: lag(db) == 0, timeout=60, what="new traffic after the rebuild")
    finally:
        for process in processes:
            assert stop_instance(process) == 0
    actual, expected = ledger_matches_replay(db)
    assert actual == expected
    assert '"command": "rebuild"' in cli(config, "audit", "--json")
