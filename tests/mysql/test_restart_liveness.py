"""A standalone MariaDB restart under two running instances: every named lock (each
instance's liveness signal) goes with the server and comes back as each instance
reconnects. A peer trusts a freed lock only once its own was held through the
confirmation window, so nobody is declared gone by the restart; both own a share again
once the server is back, and every message is applied once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusters import (
    lag,
    ledger_matches_replay,
    owners,
    seed_ledger,
    start_instance,
    stop_instance,
    wait_until,
    write_config,
)
from private_mariadb import PrivateMariaDB, running_server

from messaging import Database
from messaging.store._liveness import GONE
from messaging.store._migrations import migrate

pytestmark = [pytest.mark.mysql, pytest.mark.multiprocess]

STALE = 60.0  # the restart must not be waited out: only the liveness signal could err
SETTINGS = {
    "stale-instance-timeout": "60s",
    "heartbeat-interval": "300ms",
    "rebalance-interval": "1s",
    "idle-poll-interval": "100ms",
}
DOWN_FOR = 2.0
"""Seconds the server stays stopped."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    with running_server(tmp_path, "restart") as private:
        yield private


def _holders(db: Database) -> set[str]:
    """The names owning a partition, when every partition is OWNED (else empty)."""
    current = owners(db, stale=STALE)
    if not current or any(state != "OWNED" for _, state in current.values()):
        return set()
    return {str(name) for name, _ in current.values()}


def test_a_restarted_server_declares_nobody_gone(server: PrivateMariaDB, tmp_path: Path) -> None:
    url = server.url("restart")
    db = Database(url)
    migrate(db)
    db.prepare()
    seed_ledger(db, 500, seed=61)
    logs = [tmp_path / f"{name}.log" for name in ("a", "b")]
    instances = [
        start_instance(
            write_config(tmp_path / f"{p.stem}.yaml", db, consumer=SETTINGS), p.stem, log=p
        )
        for p in logs
    ]
    try:
        wait_until(lambda: _holders(db) == {"a", "b"}, timeout=60, what="both to share")
        server.stop()
        time.sleep(DOWN_FOR)  # the outage itself: every lock and session is gone
        server.start()
        back = time.monotonic()
        db.engine.dispose()  # the test's own pooled connections died with the server
        seed_ledger(db, 300, seed=62, prefix="after")
        wait_until(lambda: _holders(db) == {"a", "b"}, timeout=60, what="both to share again")
        again = time.monotonic() - back
        wait_until(lambda: lag(db) == 0, timeout=60, what="everything applied")
    finally:
        codes = [stop_instance(p) for p in instances]
    declared = sum(p.read_text(encoding="utf-8").count(GONE) for p in logs)
    print(f"\nserver restarted: both own a share {again:.2f} s after it is back; gone: {declared}")
    actual, expected = ledger_matches_replay(db)
    db.dispose()
    assert codes == [0, 0]
    assert declared == 0
    assert actual == expected
