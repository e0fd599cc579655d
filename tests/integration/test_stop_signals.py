"""A stop signal is never lost, whichever thread the kernel hands it to: an instance sent
SIGTERM right after SIGCONT (a frozen process thawed and stopped at once, as a container
runtime or a deploy does) stops cleanly and promptly every time, and so does one whose
SIGTERM is delivered to another thread than the main one (which a process-directed
signal may be). The main thread used to wait on an event without a timeout: a signal
taken by another thread left it asleep, and the Python handler never ran. It now wakes
every :data:`~messaging.runtime._signals.POLL` seconds, and the handler only records
the signal (an ``Event.set()`` in it can deadlock inside that event's own wait)."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from clusters import registered, seed_ledger, start_instance, wait_until, write_config

from messaging import Database

pytestmark = pytest.mark.multiprocess

ROUNDS = 4


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    """Signals are the process's business: one backend is enough."""
    database = Database(f"sqlite:///{tmp_path}/signals.db")
    database.prepare()
    yield database
    database.dispose()


def test_sigterm_right_after_sigcont_stops_the_instance_every_time(
    sqlite_db: Database, tmp_path: Path
) -> None:
    db = sqlite_db
    seed_ledger(db, 200, seed=71)
    config = write_config(tmp_path / "config.yaml", db)
    took = []
    for n in range(ROUNDS):
        name = f"s{n}"
        process = start_instance(config, name)
        try:
            wait_until(partial(registered, db, name), timeout=60, what=f"{name} to register")
            os.kill(process.pid, signal.SIGSTOP)
            time.sleep(0.05 * (n % 3))  # frozen for a moment (0 to 100 ms)
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGTERM)
            sent = time.monotonic()
            code = process.wait(timeout=30)
            took.append(time.monotonic() - sent)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert code == 0, f"{name} exited with {code}"
    print(f"\nstops after SIGCONT+SIGTERM: {', '.join(f'{t:.2f}' for t in took)} s")
    assert max(took) < 10.0


SYS_TGKILL = 234  # x86-64 Linux


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to thread ``tid`` of process ``pid`` (``tgkill(2)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def test_a_sigterm_delivered_to_another_thread_stops_the_instance(
    sqlite_db: Database, tmp_path: Path
) -> None:
    db = sqlite_db
    config = write_config(tmp_path / "config.yaml", db)
    process = start_instance(config, "threads")
    try:
        wait_until(lambda: registered(db, "threads"), timeout=60, what="it to register")
        others = wait_until(
            lambda: [int(t) for t in os.listdir(f"/proc/{process.pid}/task")][1:],
            timeout=30,
            what="its loops to run in threads",
        )
        others = [tid for tid in others if tid != process.pid]
        _tgkill(process.pid, others[0], signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
