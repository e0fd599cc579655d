"""Helpers for tests that run real ``projections`` processes against a shared database."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml
from forked import Process, run, spawn
from sqlalchemy import select

from messaging import Database, MessageStore
from messaging._messages import registry
from messaging._settings import ConsumerSettings
from projections._reports import consumers_report
from projections.examples import ledger

SUPPORT = Path(__file__).resolve().parent
"""This directory: application modules of the tests live here."""

FAST_CONSUMER: dict[str, Any] = {
    "rebalance-interval": "300ms",
    "stale-instance-timeout": "1s",
    "heartbeat-interval": "200ms",
    "graceful-shutdown-timeout": "3s",
    "idle-poll-interval": "50ms",
    "conflict-retry": {"max-retries": 5, "max-delay": "100ms"},
}
"""The consumer settings of :func:`write_config`: sub-second intervals."""


def write_config(
    path: Path,
    db: Database,
    *,
    batch_size: int = 100,
    extra: str = "",
    consumer: Mapping[str, Any] | None = None,
) -> Path:
    """A config file pointing at ``db`` with :data:`FAST_CONSUMER` settings (``consumer``
    overrides some of them) plus ``extra`` YAML."""
    settings = {
        "database": db.url,
        "table-prefix": db.schema.prefix,
        "messaging": {"consumer": {**FAST_CONSUMER, "batch-size": batch_size, **(consumer or {})}},
    }
    path.write_text(yaml.safe_dump(settings, sort_keys=False) + extra, encoding="utf-8")
    return path


def start_instance(
    config: Path,
    name: str,
    *modules: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    options: Sequence[str] = (),
    log_level: str = "WARNING",
) -> Process:
    """Start ``projections run`` as a real OS process (forked, :mod:`forked`), with
    ``env`` added to its environment (tests/support on its path), its log (stderr, from
    ``log_level`` up) written to ``log`` if given, and more ``options`` of ``run``
    (``--admin-port``)."""
    path = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
    with ExitStack() as stack:
        stderr = 2 if log is None else stack.enter_context(log.open("ab")).fileno()
        process = spawn(
            [
                "--log-level",
                log_level,
                "run",
                *(modules or ("projections.examples.ledger",)),
                "--config",
                str(config),
                "--instance-name",
                name,
                *options,
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})},
            stderr=stderr,
        )
    _STARTED.append(process)
    return process


_STARTED: list[Process] = []
"""Every process :func:`start_instance` started, for :func:`kill_leftovers`."""


def kill_leftovers() -> list[int]:
    """SIGKILL the started processes still running (a test that failed before stopping
    them), so that none outlives its test; return their pids."""
    killed = []
    for process in _STARTED:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
            killed.append(process.pid)
    _STARTED.clear()
    return killed


def cli(config: Path, *args: str) -> str:
    """Run a ``projections`` command against ``config`` in a real process; its stdout
    (CalledProcessError, with its stderr, if it fails)."""
    done = run([*args, "--config", str(config)])
    done.check_returncode()
    return done.stdout


def stop_instance(process: Process, timeout: float = 30) -> int:
    """SIGTERM a process and wait for its exit code."""
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=timeout)


POLL_FIRST, POLL_MOST = 0.005, 0.05
"""Seconds between two checks of a :func:`wait_until` condition: from the first, doubled
after each check up to the most (a condition met soon is seen within milliseconds; a
long wait costs 20 checks a second, each a few statements, not 50)."""


def wait_until(condition: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = POLL_FIRST
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(POLL_MOST, 2 * pause)


def registered(db: Database, name: str) -> bool:
    """Whether an instance named ``name`` has its row."""
    i = db.schema.instances
    with db.read() as conn:
        return conn.execute(select(i.c.id).where(i.c.name == name)).first() is not None


def seed_ledger(db: Database, messages: int, seed: int = 1, prefix: str = "acct") -> int:
    """Append about ``messages`` ledger messages; return how many were appended."""
    store = MessageStore(db)
    written = 0
    commands = list(ledger.traffic(seed, messages, prefix=prefix))
    for start in range(0, len(commands), 200):
        with db.transaction() as conn:
            for command in commands[start : start + 200]:
                for source, event in command:
                    store.append(conn, ledger.TOPIC, source, [event])
                    written += 1
    return written


def lag(db: Database, consumer: str = "ledger-balances") -> int | None:
    """Total lag of a consumer, or None while it is not declared yet."""
    report = consumers_report(db, ConsumerSettings())
    for entry in report["consumers"]:
        if entry["name"] == consumer:
            total: int = sum(p["lag"] for p in entry["partitions"])
            return total
    return None


def live_version(db: Database, consumer: str = "ledger-balances") -> int | None:
    """The number of the live version of ``consumer`` (None while not declared yet)."""
    c = db.schema.consumers
    with db.read() as conn:
        row = conn.execute(
            select(c.c.version).where(c.c.tenant == db.tenant, c.c.name == consumer)
        ).one_or_none()
    return None if row is None else int(row.version or 1)


def ledger_matches_replay(db: Database) -> tuple[dict[str, Any], dict[str, Any]]:
    """(read model, sequential replay) of the ledger balances."""
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(
            select(m.c.type, m.c.payload).where(m.c.tenant == db.tenant).order_by(m.c.position)
        ).all()
        stored = conn.execute(select(ledger.balances)).mappings().all()
    expected = ledger.replay(registry.decode(t, p) for t, p in rows)
    return ledger.read_model(stored), expected


def owners(
    db: Database, consumer: str = "ledger-balances", *, stale: float = 1.0
) -> dict[int, tuple[str | None, str]]:
    """Partition → (instance name, state) as ``projections status`` reports it (instances
    whose stale-instance-timeout is ``stale``)."""
    report = consumers_report(
        db,
        ConsumerSettings(
            stale_instance_timeout=stale, rebalance_interval=0.3, heartbeat_interval=0.2
        ),
    )
    for entry in report["consumers"]:
        if entry["name"] == consumer:
            return {p["partition"]: (p["instance"], p["state"]) for p in entry["partitions"]}
    return {}


def owned_by(
    db: Database, names: set[str], consumer: str = "ledger-balances"
) -> dict[int, str] | None:
    """Partition → owner name when every partition is OWNED by one of ``names``, else None."""
    current = owners(db, consumer)
    if not current or any(
        state != "OWNED" or name not in names for name, state in current.values()
    ):
        return None
    return {p: str(name) for p, (name, _) in current.items()}


def manual_clock_database(database_url: str, table_prefix: str) -> Database:
    """A prepared database (migrated on MySQL) whose clock moves only when told to."""
    from messaging.store._clock import ManualClock
    from messaging.store._migrations import migrate

    db = Database(database_url, table_prefix=table_prefix, clock=ManualClock())
    if not db.is_sqlite:
        migrate(db)
    db.prepare()
    return db


def consumer_worker(
    db: Database,
    consumer: type,
    *,
    instance_id: str,
    instance_name: str | None = None,
    whole: bool = False,
    worker_class: type | None = None,
    max_parked: int | None = None,
) -> Any:
    """A ConsumerWorker (or a ``worker_class``) of one decorated consumer class, with default
    settings and no plugins (``instance_name`` defaults to ``instance_id``); ``max_parked``:
    parking sources (``on-failure: park-source``), at most that many per partition."""
    from messaging import Settings, create_plugin_manager
    from messaging._consumers import consumer_spec
    from messaging.applying._worker import ConsumerWorker
    from messaging.failures._parking import Parking

    spec = consumer_spec(consumer)
    return (worker_class or ConsumerWorker)(
        db=db,
        spec=spec,
        instance_id=instance_id,
        instance_name=instance_name or instance_id,
        settings=Settings().messaging.consumer,
        hooks=create_plugin_manager([], load_entrypoints=False).hook,
        registry=registry,
        whole=whole,
        parking=None if max_parked is None else Parking(db, spec.name, max_parked),
    )
