"""A SQLite file whose disk fills under a running instance is an outage, not a flood: one
WARNING per loop naming the disk, no traceback, ``ready`` 503 saying why, ``projections
health`` degraded; once space is freed the instance goes on and loses nothing. The disk is
a small tmpfs of the test's own (mounting one needs root: skipped otherwise)."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import health_app
import pytest
from clusters import start_instance, stop_instance, wait_until, write_config

from messaging import Database

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs mounted for the test."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill(path: Path) -> None:
    """Write ``path`` until the disk holding it has not one byte left."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(descriptor, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(descriptor)


def _truncate_wal(path: Path) -> bool:
    """Checkpoint the write-ahead log into the file and truncate it, so that the next
    writes must grow it again; False when a reader or writer held it back."""
    connection = sqlite3.connect(str(path), timeout=5)
    try:
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return bool(busy == 0)
    finally:
        connection.close()


def test_a_full_disk_is_one_warning_per_loop_and_loses_nothing(disk: Path, tmp_path: Path) -> None:
    path = disk / "app.db"
    db = Database(f"sqlite:///{path}")
    db.prepare()
    config = write_config(tmp_path / "config.yaml", db, consumer={"stale-instance-timeout": "20s"})
    port, log = health_app.free_port(), tmp_path / "p1.log"
    process = start_instance(
        config, "p1", "health_app", log=log, options=("--admin-port", str(port))
    )
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=60, what="ready")
    health_app.append(db, 0, 20)
    wait_until(lambda: health_app.applied(db) == 20, timeout=60, what="the first messages applied")

    wait_until(lambda: _truncate_wal(path), timeout=30, what="the log truncated")
    _fill(disk / "filler")
    health_app.wait_refused(config, port, f"the disk holding {path} is full")

    (disk / "filler").unlink()
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=30, what="back")
    health_app.append(db, 20, 20)
    wait_until(lambda: health_app.applied(db) == 40, timeout=60, what="the later messages applied")
    assert stop_instance(process) == 0
    db.dispose()

    health_app.assert_quiet(log, f"the disk holding {path}")
