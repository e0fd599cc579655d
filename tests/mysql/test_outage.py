"""A database outage is logged by its edges: one WARNING when the database goes, one INFO
with how long it was down when it is back (for the instance's work and its heartbeat),
nothing per poll in between; the instance goes on applying afterwards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from clusters import SUPPORT, wait_until
from private_mariadb import PrivateMariaDB, running_server
from sqlalchemy import func, select

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from messaging.store._migrations import migrate
from projections.examples import ledger

pytestmark = [pytest.mark.mysql, pytest.mark.multiprocess]

TIMINGS = {  # quick rounds, and an outage well within stale-instance-timeout
    "rebalance-interval": "1s",
    "stale-instance-timeout": "20s",
    "heartbeat-interval": "200ms",
    "idle-poll-interval": "50ms",
    "conflict-retry": {"max-retries": 3, "max-delay": "100ms"},
}
RUN = [sys.executable, "-m", "projections.cli", "run", "projections.examples.ledger"]
DOWN_FOR = 3.0
"""Seconds the server stays stopped: many polls and heartbeats of the instance."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    with running_server(tmp_path, "outage") as private:
        yield private


ACCOUNTS = [f"acct-{n}" for n in range(7)]


def _traffic(db: Database, stop: threading.Event, written: list[int], failed: list[int]) -> None:
    """A deposit of 1 every 20 ms; an append that meets the outage fails (and may still have
    committed: its outcome is unknown), and is counted apart."""
    store = MessageStore(db)
    for n in range(1_000_000):
        if stop.wait(0.02):
            return
        account = ACCOUNTS[n % len(ACCOUNTS)]
        try:
            with db.transaction() as conn:
                store.append(conn, ledger.TOPIC, account, [ledger.Deposited(account, 1)])
            written.append(n)
        except Exception:
            failed.append(n)


def test_an_outage_is_one_warning_and_one_info_per_loop(
    server: PrivateMariaDB, tmp_path: Path
) -> None:
    """Stop the instance's MariaDB for a few seconds under traffic: its log has exactly one
    WARNING and one INFO for its work and for its heartbeat, no traceback, and every
    message written is applied afterwards."""
    url = server.url("outage")
    db = Database(url)
    migrate(db)
    db.prepare()
    with db.transaction() as conn:
        for account in ACCOUNTS:
            MessageStore(db).append(
                conn, ledger.TOPIC, account, [ledger.AccountOpened(account, "o")]
            )
    config = tmp_path / "app.yaml"
    settings = {"database": url, "messaging": {"consumer": TIMINGS}}
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    log_path = tmp_path / "instance.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
    with log_path.open("wb") as log:
        instance = subprocess.Popen(
            [*RUN, "--config", str(config), "--instance-name", "steady"],
            stderr=log,
            env=env,
        )
    stop = threading.Event()
    written: list[int] = []
    failed: list[int] = []
    writer = threading.Thread(target=_traffic, args=(db, stop, written, failed))
    writer.start()
    try:
        log_text = log_path.read_text
        wait_until(lambda: "event=claim" in log_text(), timeout=60, what="the first claim")
        wait_until(lambda: len(written) > 20, timeout=30, what="traffic before the outage")
        server.stop()
        wait_until(
            lambda: log_text().count("unreachable") >= 2, timeout=30, what="the outage warnings"
        )
        time.sleep(DOWN_FOR)  # the outage itself: polls and heartbeats keep failing meanwhile
        server.start()
        wait_until(
            lambda: log_text().count("reachable again") >= 2, timeout=60, what="the recovery"
        )
        count = len(written) + 20
        wait_until(lambda: len(written) >= count, timeout=30, what="traffic after the outage")
    finally:
        stop.set()
        writer.join()
    applied = _wait_applied(db, len(written))
    instance.send_signal(signal.SIGTERM)
    assert instance.wait(timeout=60) == 0
    db.dispose()

    lines = log_path.read_text().splitlines()
    # A transaction cut by the stop may also say, once, that its outcome is unknown and is
    # re-read (the lost-acknowledgement rule); nothing else may warn.
    unknown = [line for line in lines if "outcome unknown" in line]
    # At most the batches in flight (executor.max-workers, the lanes apply in parallel)
    # and a heartbeat.
    assert len(unknown) <= ConsumerSettings().executor.max_workers + 1, unknown
    warnings = [
        line
        for line in lines
        if (" WARNING " in line or " ERROR " in line) and "outcome unknown" not in line
    ]
    assert warnings == [
        line
        for line in lines
        if re.search(r"WARNING messaging.runtime.outage: instance steady", line)
    ], warnings
    assert len([w for w in warnings if "instance steady: database unreachable" in w]) == 1
    assert len([w for w in warnings if "instance steady heartbeat: database unreachable" in w]) == 1
    back = [line for line in lines if "reachable again after" in line]
    assert len(back) == 2, back
    for line in back:
        seconds = float(re.search(r"after ([0-9.]+) s", line)[1])  # type: ignore[index]
        assert DOWN_FOR <= seconds < DOWN_FOR + 30, line
    assert "Traceback" not in "\n".join(lines)
    assert len(written) <= applied <= len(written) + len(failed)


def _wait_applied(db: Database, expected: int) -> int:
    """The total balance of the read model once it holds every deposit written."""

    def total() -> int:
        with db.read() as conn:
            value = conn.execute(select(func.sum(ledger.balances.c.balance))).scalar()
        return int(value or 0) if int(value or 0) >= expected else 0

    return int(wait_until(total, timeout=60, what="every deposit applied"))
