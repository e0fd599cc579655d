"""Single-owner mode with real processes: one elected owner, takeover after a crash,
and a switch between modes that keeps checkpoints and never has two modes apply."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from clusters import (
    lag,
    ledger_matches_replay,
    owned_by,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)

from messaging import Database

pytestmark = pytest.mark.multiprocess

SINGLE_OWNER = """\
projections:
  consumers:
    ledger-balances: {distribution: single-owner}
"""


def test_single_owner_takeover_and_mode_switch(db: Database, tmp_path: Path) -> None:
    """One instance owns every partition; a standby takes over; modes switch safely."""
    seed_ledger(db, 2000, seed=21)
    single = write_config(tmp_path / "single.yaml", db, batch_size=50, extra=SINGLE_OWNER)
    partitioned = write_config(tmp_path / "partitioned.yaml", db, batch_size=50)
    processes = {name: start_instance(single, name) for name in ("s1", "s2")}
    try:
        owner_map = wait_until(lambda: owned_by(db, {"s1", "s2"}), timeout=60, what="an owner")
        time.sleep(0.7)  # two rebalance rounds: the election must stay stable, not alternate
        owner_map = owned_by(db, {"s1", "s2"})
        assert owner_map is not None and len(set(owner_map.values())) == 1, owner_map
        elected = next(iter(owner_map.values()))
        standby = "s2" if elected == "s1" else "s1"

        processes[elected].kill()
        processes[elected].wait()
        wait_until(lambda: owned_by(db, {standby}), timeout=10, what="the standby to take over")

        processes["p1"] = start_instance(partitioned, "p1")
        wait_until(
            lambda: owned_by(db, {"p1"}),
            timeout=15,
            what="the single-owner instance to step back for the partitioned one",
        )
        seed_ledger(db, 500, seed=22, prefix="mid")
        wait_until(lambda: lag(db) == 0, timeout=60, what="p1 to catch up")

        assert stop_instance(processes.pop("p1")) == 0
        wait_until(lambda: owned_by(db, {standby}), timeout=10, what="single-owner to resume")
        seed_ledger(db, 500, seed=23, prefix="late")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the single owner to catch up")
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_instance(process)
    actual, expected = ledger_matches_replay(db)
    assert actual == expected
