"""SIGSTOP an instance process as a frozen owner: on SQLite at a moment it holds no write
lock (the whole file would wait for it otherwise)."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

from clusters import wait_until
from forked import Process
from sqlalchemy import make_url

from messaging import Database


def write_lock_free(db: Database) -> bool:
    """Whether a SQLite write transaction can begin now (no frozen process holds the lock)."""
    probe = sqlite3.connect(str(make_url(db.url).database), timeout=0.1)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def freeze(process: Process, db: Database) -> None:
    """SIGSTOP ``process``; on SQLite at a moment it holds no write lock."""
    while True:
        process.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(process.pid), timeout=10, what="the process to stop")
        if not db.is_sqlite or write_lock_free(db):
            return
        process.send_signal(signal.SIGCONT)
