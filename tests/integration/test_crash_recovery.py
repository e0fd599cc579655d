"""A projection process killed with SIGKILL mid-run and restarted loses nothing and
applies nothing twice: its read model equals a sequential replay."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusters import (
    lag,
    ledger_matches_replay,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)

from messaging import Database

pytestmark = pytest.mark.multiprocess


def test_sigkill_mid_run_then_restart_equals_sequential_replay(
    db: Database, tmp_path: Path
) -> None:
    """After a SIGKILL part-way and a restart, every message has been applied exactly once."""
    total = seed_ledger(db, 12_000)
    config = write_config(tmp_path / "config.yaml", db, batch_size=5)

    first = start_instance(config, "crash-1")
    try:
        wait_until(
            lambda: (current := lag(db)) is not None and 0 < current < total * 0.8,
            timeout=60,
            what="the first instance to apply part of the stream",
        )
    finally:
        first.kill()
        first.wait(timeout=10)
    remaining = lag(db)
    assert remaining is not None and remaining > 0, "the kill came too late to be mid-run"

    second = start_instance(config, "crash-2")
    try:
        wait_until(lambda: lag(db) == 0, timeout=90, what="the restarted instance to catch up")
    finally:
        assert stop_instance(second) == 0

    actual, expected = ledger_matches_replay(db)
    assert actual == expected
