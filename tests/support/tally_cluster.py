"""A cluster of real processes running ``tally_app``, for tests of what crosses processes
(declaration changes, operator commands)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tally_app
from clusters import start_instance, stop_instance, wait_until, write_config
from forked import Process
from sqlalchemy import select
from sqlalchemy.exc import OperationalError, ProgrammingError

from messaging import Database, MessageStore


class TallyCluster:
    """Real ``projections run`` processes of ``tally_app``, each started with a declaration
    version of its own; a context manager that stops those still running."""

    def __init__(
        self, db: Database, tmp_path: Path, consumer: Mapping[str, Any] | None = None
    ) -> None:
        """``consumer``: settings that override those of :func:`clusters.write_config`."""
        self.db = db
        self.tmp_path = tmp_path
        self.config = write_config(tmp_path / "config.yaml", db, consumer=consumer)
        self.processes: dict[str, Process] = {}
        self.appended = 0

    def start(self, name: str, version: int) -> None:
        self.processes[name] = start_instance(
            self.config,
            name,
            "tally_app",
            env={"TALLY_VERSION": str(version)},
            log=self.tmp_path / f"{name}.log",
        )

    def __enter__(self) -> TallyCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for name in list(self.processes):
            self.stop(name)

    def stop(self, name: str) -> float:
        """SIGTERM ``name`` and wait for its clean exit; return the seconds it took."""
        started = time.monotonic()
        assert stop_instance(self.processes.pop(name)) == 0, f"{name} did not stop cleanly"
        return time.monotonic() - started

    def log(self, name: str) -> str:
        path = self.tmp_path / f"{name}.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def append(self, count: int) -> None:
        store = MessageStore(self.db)
        with self.db.transaction() as conn:
            for n in range(self.appended, self.appended + count):
                store.append(conn, tally_app.TOPIC, f"s{n}", [tally_app.Counted(n)])
        self.appended += count

    def versions(self) -> Counter[int]:
        """How many messages the read model holds, by the declaration that applied them."""
        try:
            with self.db.read() as conn:
                return Counter(conn.execute(select(tally_app.applied.c.version)).scalars())
        except (OperationalError, ProgrammingError):  # not created yet, or being recreated
            return Counter()

    def wait_applied_by(self, version: int, what: str) -> None:
        """Until the read model holds every message, each applied under ``version`` only."""
        wait_until(
            lambda: self.versions() == Counter({version: self.appended}), timeout=60, what=what
        )

    def wait_logged(self, name: str, text: str) -> None:
        wait_until(lambda: text in self.log(name), timeout=60, what=f"{name} to log {text!r}")
