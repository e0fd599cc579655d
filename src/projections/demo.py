"""``projections demo``: the ledger example end to end on an embedded SQLite file.

Writes realistic traffic while instance processes of the example app apply it, shows
progress live, then stops the instances gracefully and checks the read model against a
sequential replay of every message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from messaging.database import Database
from messaging.errors import ConfigError
from messaging.messages import registry
from messaging.settings import ConsumerSettings
from messaging.store import MessageStore
from projections.examples import ledger
from projections.reports import consumers_report

DEMO_CONFIG = """\
messaging:
  consumer:
    rebalance-interval: 1s
    stale-instance-timeout: 3s
    heartbeat-interval: 500ms
    graceful-shutdown-timeout: 5s
    idle-poll-interval: 100ms
    batch-size: 200
    conflict-retry: {max-retries: 5, max-delay: 200ms}
"""


def _fresh_sqlite(url: str) -> Path:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        raise ConfigError("demo: --database must be a SQLite file URL (sqlite:///demo.db)")
    path = Path(parsed.database)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def _write_traffic(db: Database, messages: int, seed: int, written: list[int]) -> None:
    store = MessageStore(db)
    for command in ledger.traffic(seed, messages):
        with db.transaction() as conn:
            for source, event in command:
                store.append(conn, ledger.TOPIC, source, [event])
        written[0] += len(command)


def _progress(db: Database, settings: ConsumerSettings) -> tuple[int, int, int]:
    """(messages in the topic, messages not yet applied, partitions owned)."""
    messages = db.schema.messages
    with db.read() as conn:
        total = conn.execute(
            select(func.count()).select_from(messages).where(messages.c.tenant == db.tenant)
        ).scalar_one()
    report = consumers_report(db, settings)
    partitions = [p for c in report["consumers"] for p in c["partitions"]]
    lag = sum(p["lag"] for p in partitions)
    owned = sum(1 for p in partitions if p["state"] == "OWNED")
    return int(total), lag, owned


def run_demo(*, database: str, messages: int, workers: int, seed: int) -> int:
    """Run the demo; return 0 when the read model equals the sequential replay."""
    path = _fresh_sqlite(database)
    db = Database(database)
    db.prepare()
    settings = ConsumerSettings()
    config = Path(tempfile.mkdtemp(prefix="projections-demo-")) / "demo.yaml"
    config.write_text(DEMO_CONFIG, encoding="utf-8")
    print(f"demo database: {path.resolve()}")
    print(f"starting {workers} instance process(es) of projections.examples.ledger")
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "projections.cli",
                "--log-level",
                "WARNING",
                "run",
                "projections.examples.ledger",
                "--database",
                database,
                "--config",
                str(config),
                "--instance-name",
                f"demo-{index}",
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for index in range(1, workers + 1)
    ]
    written = [0]
    writer = threading.Thread(
        target=_write_traffic, args=(db, messages, seed, written), daemon=True
    )
    started = time.monotonic()
    writer.start()
    try:
        while True:
            time.sleep(0.5)
            total, lag, owned = _progress(db, settings)
            line = (
                f"\r  written {written[0]:>7}  applied {total - lag:>7}  lag {lag:>6}  "
                f"partitions owned {owned}  {time.monotonic() - started:5.1f}s"
            )
            print(line, end="", flush=True)
            if not writer.is_alive() and lag == 0 and total == written[0]:
                break
            dead = [p.args for p in processes if p.poll() is not None]
            if dead:
                print(f"\ninstance process exited early: {dead}", file=sys.stderr)
                return 1
    finally:
        print()
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)
    return _verify(db, written[0])


def _verify(db: Database, written: int) -> int:
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(select(m.c.type, m.c.payload).order_by(m.c.position)).all()
        stored = conn.execute(select(ledger.balances)).mappings().all()
    expected = ledger.replay(registry.decode(t, p) for t, p in rows)
    actual = ledger.read_model(stored)
    db.dispose()
    if actual == expected:
        money = sum(balance for _, balance, _ in actual.values())
        print(
            f"OK: read model equals a sequential replay of {written} messages "
            f"({len(actual)} accounts, total balance {money})"
        )
        return 0
    wrong = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
    print(f"MISMATCH: {len(wrong)} accounts differ, e.g. {wrong[:5]}", file=sys.stderr)
    return 1
