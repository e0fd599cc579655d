"""``projections run --workers N``: a supervisor of N real instance processes.

It starts them, restarts one that dies, stops them all gracefully on SIGTERM, and
refuses an application it cannot import before starting anything.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import parked_seq_app
import pytest
from clusters import (
    cli,
    lag,
    ledger_matches_replay,
    live_version,
    seed_ledger,
    wait_until,
    write_config,
)

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from messaging.runtime._supervisor import Supervisor
from messaging.store._rows import partition_of
from projections._reports import instances_report

pytestmark = pytest.mark.multiprocess

REPORT_SETTINGS = ConsumerSettings(
    stale_instance_timeout=1.0, rebalance_interval=0.3, heartbeat_interval=0.2
)
"""The fast config's liveness rule, for reading the instances table."""
START_TIMEOUT = 30.0  # spawning two interpreters that import the application
RESTART_TIMEOUT = 15.0  # first restart after 0.5 s, plus the start-up of a new process


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path}/x.db")
    db.prepare()
    yield db
    db.dispose()


def _live(db: Database) -> dict[str, int]:
    """Live instance name → pid."""
    return {
        i["name"]: i["pid"] for i in instances_report(db, REPORT_SETTINGS)["instances"] if i["live"]
    }


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@contextmanager
def _supervisor(
    db: Database, config: Path, log: Path, *modules: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``projections run --workers 2`` of ``modules`` (the ledger by default), in a session
    of its own; at the end it is stopped by SIGTERM and must exit 0. Should the test fail,
    it and its workers are killed instead (none is left running)."""
    with log.open("wb") as stderr:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "projections.cli",
                "--log-level",
                "WARNING",
                "run",
                *(modules or ("projections.examples.ledger",)),
                "--workers",
                "2",
                "--instance-name",
                "sup",
                "--database",
                db.url,
                "--config",
                str(config),
            ],
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
    try:
        yield supervisor
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, log.read_text()
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()


def test_workers_are_started_restarted_and_stopped(sqlite_db: Database, tmp_path: Path) -> None:
    """Two workers start, a killed one comes back under a new pid, SIGTERM stops all."""
    db = sqlite_db
    config = write_config(tmp_path / "fast.yaml", db)
    log = tmp_path / "supervisor.log"
    with _supervisor(db, config, log) as supervisor:
        first = wait_until(
            lambda: (live := _live(db)).keys() == {"sup-1", "sup-2"} and live,
            timeout=START_TIMEOUT,
            what="two live workers sup-1 and sup-2",
        )
        if Path("/proc").is_dir():
            assert {_parent_of(pid) for pid in first.values()} == {supervisor.pid}

        killed = first["sup-1"]
        os.kill(killed, signal.SIGKILL)
        restarted = wait_until(
            lambda: (
                (live := _live(db)).keys() == {"sup-1", "sup-2"}
                and live["sup-1"] != killed
                and live
            ),
            timeout=RESTART_TIMEOUT,
            what="worker 1 restarted under a new pid",
        )
        assert restarted["sup-2"] == first["sup-2"]  # the other worker was left alone
        assert supervisor.poll() is None
        assert f"worker 1 (pid {killed}) exited with -9; restarting" in log.read_text()

    assert _live(db) == {}
    # The clean stop deleted both workers' rows; the killed one's row was removed when its
    # replacement took over the name.
    assert instances_report(db, REPORT_SETTINGS)["instances"] == []
    assert all(_gone(pid) for pid in (*first.values(), *restarted.values()))


def test_an_unknown_module_fails_fast_with_one_error_line(
    sqlite_db: Database, tmp_path: Path
) -> None:
    db = sqlite_db
    config = write_config(tmp_path / "fast.yaml", db)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "projections.cli",
            "run",
            "no_such_application_module",
            "--workers",
            "2",
            "--database",
            db.url,
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,  # a restart loop would never return
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "projections: error: cannot import application module 'no_such_application_module'"
    )
    assert instances_report(db, REPORT_SETTINGS)["instances"] == []


def test_a_worker_spawned_while_stopping_is_told_to_stop() -> None:
    """A stop signal that lands while a worker is being spawned still reaches that worker."""
    supervisor = Supervisor(
        lambda _index: [sys.executable, "-c", "import time; time.sleep(60)"], 1, stop_timeout=30
    )
    supervisor.stopping.set()
    supervisor._start(1)
    assert supervisor.processes[1].wait(timeout=30) == -signal.SIGTERM
    assert supervisor._wait_all() == 0


def test_a_worker_whose_loop_is_stuck_exits_and_is_replaced(
    sqlite_db: Database, tmp_path: Path
) -> None:
    """A worker's heartbeat loop stuck in a plugin hook (no timeout can free it): the
    watchdog says so at ERROR and exits 70, the supervisor starts the worker again."""
    db = sqlite_db
    config = write_config(
        tmp_path / "fast.yaml",
        db,
        consumer={"conflict-retry": {"max-retries": 1, "max-delay": "100ms"}},
    )
    log = tmp_path / "supervisor.log"
    support = str(Path(__file__).resolve().parents[1] / "support")
    env = {
        "STUCK_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]),
    }
    with _supervisor(db, config, log, "projections.examples.ledger", "stuck_app", env=env):
        first = wait_until(
            lambda: (live := _live(db)).keys() == {"sup-1", "sup-2"} and live,
            timeout=START_TIMEOUT,
            what="two live workers sup-1 and sup-2",
        )
        stuck = first["sup-1"]
        (tmp_path / f"stuck-{stuck}").touch()
        restarted = wait_until(
            lambda: (
                (live := _live(db)).keys() == {"sup-1", "sup-2"} and live["sup-1"] != stuck and live
            ),
            timeout=RESTART_TIMEOUT + 10,  # the watchdog's bound (3.4 s here), then a restart
            what="the stuck worker 1 replaced under a new pid",
        )
        assert restarted["sup-2"] == first["sup-2"]
        text = log.read_text()
        assert f"worker 1 (pid {stuck}) exited with 70; restarting" in text, text
        assert "its heartbeat loop made no progress" in text and "projections_heartbeat" in text


def test_workers_build_a_new_version_and_cut_over(sqlite_db: Database, tmp_path: Path) -> None:
    """Under `run --workers 2` a requested rebuild builds a new version, which takes over;
    the read model equals the replay."""
    db = sqlite_db
    seed_ledger(db, 1500, seed=81)
    config = write_config(tmp_path / "fast.yaml", db, batch_size=50)
    log = tmp_path / "supervisor.log"
    with _supervisor(db, config, log):
        wait_until(
            lambda: _live(db).keys() == {"sup-1", "sup-2"},
            timeout=START_TIMEOUT,
            what="two live workers",
        )
        wait_until(lambda: lag(db) == 0, timeout=60, what="the first pass")
        cli(config, "rebuild", "ledger-balances", "--reason", "workers")
        wait_until(lambda: live_version(db) == 2, timeout=60, what="version 2 to take over")
        wait_until(lambda: lag(db) == 0, timeout=60, what="the new version to catch up")
    actual, expected = ledger_matches_replay(db)
    assert actual == expected


def test_a_worker_whose_handler_never_returns_exits_and_is_replaced(
    sqlite_db: Database, tmp_path: Path
) -> None:
    """A handler that never returns (``apply-timeout: 1500ms``): its partition halts at once,
    the other partitions go on, and once the batch is stuck past the grace (the worker not
    live) the worker exits 70 and the supervisor starts it again (``--exit-when-stuck``,
    passed by ``--workers``)."""
    db = sqlite_db
    with db.transaction() as conn:
        parked_seq_app.metadata.create_all(conn)
    extra = "projections:\n  apply-timeout: 1500ms\n"  # above the lock-wait bound (1 s)
    config = write_config(tmp_path / "fast.yaml", db, batch_size=20, extra=extra)
    log = tmp_path / "supervisor.log"
    support = str(Path(__file__).resolve().parents[1] / "support")
    env = {
        "STUCK_SOURCE": "s-3",
        "STUCK_SECONDS": "600",
        "STUCK_STARTED": str(tmp_path / "started"),
        "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]),
    }
    sources = [f"s-{n}" for n in range(12)]
    with _supervisor(db, config, log, "parked_seq_app", env=env):
        first = wait_until(
            lambda: (live := _live(db)).keys() == {"sup-1", "sup-2"} and live,
            timeout=START_TIMEOUT,
            what="two live workers sup-1 and sup-2",
        )
        store = MessageStore(db)
        with db.transaction() as conn:
            for source in sources:
                store.append(conn, "seq", source, [parked_seq_app.Step(1)])
        exited = wait_until(
            lambda: re.search(
                r"worker (\d) \(pid (\d+)\) exited with 70; restarting", log.read_text()
            ),
            timeout=RESTART_TIMEOUT + 10,
            what="the stuck worker to exit",
        )
        index, pid = exited.groups()
        assert first[f"sup-{index}"] == int(pid)
        wait_until(
            lambda: (
                (live := _live(db)).keys() == {"sup-1", "sup-2"} and int(pid) not in live.values()
            ),
            timeout=RESTART_TIMEOUT,
            what="the worker replaced under a new pid",
        )
        text = log.read_text()
        assert "is stuck past its apply timeout (1.5s)" in text, text
        assert "in stuck (parked_seq_app.py:" in text, text
        others = [s for s in sources if partition_of(s, 4) != partition_of("s-3", 4)]
        wait_until(
            lambda: all(parked_seq_app.applied_seqs(db).get(s) == [1] for s in others),
            timeout=30,
            what="every other partition",
        )
    assert len((tmp_path / "started").read_text().split()) == 1  # halted: not handled again
