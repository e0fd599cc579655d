"""The watchdog's side of the apply timeout, on both backends with a real connection: a
statement of a batch past its deadline is interrupted; one in time is not, nor (on
MySQL/MariaDB) one whose thread is not waiting for the server; a batch that ended is no
longer watched."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable

from sqlalchemy import text

from messaging import Database
from messaging.applying._apply_timeout import ApplyDeadlines, Deadline

ENDLESS = {
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT count(*) FROM c",
    "mysql": "SELECT SLEEP(60)",
}


class Batch(threading.Thread):
    """Runs an endless statement under a deadline of ``deadlines``."""

    def __init__(self, db: Database, deadlines: ApplyDeadlines) -> None:
        super().__init__(daemon=True)
        self.db, self.deadlines = db, deadlines
        self.deadline: Deadline | None = None
        self.running = threading.Event()

    def run(self) -> None:
        with self.db.transaction() as conn, self.deadlines.bound(conn, 5.0, "c", [0]) as d:
            self.deadline = d
            self.running.set()
            with contextlib.suppress(Exception):  # SQLite: interrupted; MariaDB's SLEEP: 1
                conn.execute(text(ENDLESS[conn.dialect.name])).all()


def _look(deadlines: ApplyDeadlines, waiting: Callable[[], set[int]], times: int = 5) -> None:
    for _ in range(times):
        deadlines.look(waiting(), lambda _thread: "here")
        time.sleep(0.1)


def test_a_statement_past_its_deadline_is_interrupted(db: Database) -> None:
    now = [0.0]
    deadlines = ApplyDeadlines("instance t", clock=lambda: now[0])
    batch = Batch(db, deadlines)
    batch.start()
    assert batch.running.wait(10)
    _look(deadlines, lambda: {batch.ident or 0})  # in time: left alone
    assert batch.is_alive()
    now[0] = 5.1
    _look(deadlines, lambda: {batch.ident or 0}, times=1)
    batch.join(5)
    assert not batch.is_alive(), "the statement was not interrupted"
    assert batch.deadline is not None and batch.deadline.passed()
    assert not deadlines._running  # the batch ended: no longer watched


def test_a_thread_not_waiting_for_the_server_is_not_killed(mysql_database_url: str) -> None:
    """MySQL/MariaDB only: SQLite's interrupt is a no-op between statements, so no wait
    for the server is looked for there."""
    db = Database(mysql_database_url, table_prefix=f"d{uuid.uuid4().hex[:8]}_")
    now = [0.0]
    deadlines = ApplyDeadlines("instance t", clock=lambda: now[0])
    batch = Batch(db, deadlines)
    batch.start()
    assert batch.running.wait(10)
    now[0] = 5.1
    _look(deadlines, set)  # (its thread seen elsewhere than in a wait for the server)
    assert batch.is_alive() and batch.deadline is not None and batch.deadline.expired
    _look(deadlines, lambda: {batch.ident or 0}, times=1)
    batch.join(10)
    assert not batch.is_alive()
    db.dispose()
