"""Rollback and retention of a projection's versions, on real ``projections run``
processes: a rollback builds the version the live one replaced again from where it was
retired (only the messages since), and it takes over with readers never going back;
after each cutover only the latest ``retired-versions`` retired versions are kept, with
their tables; ``drop-version`` drops one; what cannot be done is refused, changing
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
from readers import Reader
from sqlalchemy import inspect

from messaging import Database
from messaging._errors import OperationError
from projections._version_commands import drop_version, rollback

pytestmark = pytest.mark.multiprocess

BALANCES = "ledger-balances"


def _versions(config: Path) -> dict[int, dict[str, Any]]:
    report = json.loads(cli(config, "versions", BALANCES, "--json"))
    return {v["version"]: v for v in report["versions"]}


def _tables(db: Database) -> set[str]:
    with db.read() as conn:
        return {t for t in inspect(conn).get_table_names() if t.endswith("ledger_balances")}


def _swap_to(db: Database, config: Path, version: int, *command: str) -> None:
    cli(config, *command, BALANCES, "--reason", "test")
    wait_until(lambda: live_version(db) == version, timeout=60, what=f"version {version} live")
    wait_until(lambda: lag(db) == 0, timeout=60, what=f"version {version} to catch up")


def test_rollback_catches_up_only_since_it_was_retired_and_retention_keeps_the_latest(
    db: Database, tmp_path: Path
) -> None:
    seeded = seed_ledger(db, 2000, seed=51)
    config = write_config(tmp_path / "config.yaml", db, batch_size=50)
    processes = [start_instance(config, name) for name in ("r1", "r2")]
    reader = Reader(db)
    try:
        wait_until(lambda: owned_by(db, {"r1", "r2"}), timeout=60, what="r1 and r2 to share")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the first pass")
        reader.start()
        _swap_to(db, config, 2, "rebuild")
        versions = _versions(config)
        assert versions[2]["role"] == "live" and versions[1]["role"] == "retired"
        assert versions[1]["retired_by"] == 2
        assert versions[1]["tables"] == ["_v1__ledger_balances"]
        for process in processes:  # none builds it until they start again: measurable
            assert stop_instance(process) == 0
        retired_with = seeded
        seeded += seed_ledger(db, 300, seed=52, prefix="after")
        cli(config, "rollback", BALANCES, "--reason", "bad release")
        building = _versions(config)[1]
        assert building["role"] == "building"
        assert building["build"] == {**building["build"], "applied": retired_with, "total": seeded}
        processes = [start_instance(config, name) for name in ("r1", "r2")]
        wait_until(lambda: live_version(db) == 1, timeout=60, what="version 1 live again")
        wait_until(lambda: lag(db) == 0, timeout=60, what="version 1 to catch up")
        versions = _versions(config)
        assert versions[2]["role"] == "retired" and versions[2]["retired_by"] == 1
        actual, expected = ledger_matches_replay(db)
        assert actual == expected

        _swap_to(db, config, 3, "rebuild")  # retention 1: version 2 goes, 1 stays
        assert set(_versions(config)) == {3, 1}
        assert _tables(db) == {"ledger_balances", "_v1__ledger_balances"}
        reader.stop()

        cli(config, "drop-version", BALANCES, "1", "--reason", "no way back")
        assert set(_versions(config)) == {3}
        assert _tables(db) == {"ledger_balances"}
        with pytest.raises(OperationError, match="no retired version to roll back to"):
            rollback(db, BALANCES, who="test", reason="")
        with pytest.raises(OperationError, match="is live: only a retired version"):
            drop_version(db, BALANCES, 3, who="test", reason="")
        with pytest.raises(OperationError, match="no version 2; versions: 3 \\(live\\)"):
            drop_version(db, BALANCES, 2, who="test", reason="")
    finally:
        reader.stop()
        for process in processes:
            assert stop_instance(process) == 0
    print(f"\nreads {reader.reads}, went back {reader.went_back}, slowest {reader.slowest:.2f} s")
    assert reader.reads > 20 and reader.errors == [] and reader.went_back == 0
    actual, expected = ledger_matches_replay(db)
    assert actual == expected
