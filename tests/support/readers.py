"""A reader of the ledger's read model and a ledger appender, for the rebuild tests: the
reader queries the declared table every few milliseconds, as an application would, and
counts the answers that went back (an empty, partly built or older read model)."""

from __future__ import annotations

import threading
import time

from clusters import seed_ledger
from sqlalchemy import func, select

from messaging import Database
from projections.examples import ledger


class Reader(threading.Thread):
    """Reads the ledger's accounts and entries every ``every`` seconds through an engine of
    its own, as an application would, and counts answers that went back (fewer accounts
    or entries than an earlier answer: an empty, partly built or older read model)."""

    def __init__(self, db: Database, every: float = 0.01, *, retry_aborts: bool = False) -> None:
        super().__init__(daemon=True)
        self.db = Database(db.url, table_prefix=db.schema.prefix)
        self.every = every
        self.retry_aborts = retry_aborts  # Galera: a cutover's RENAME aborts a read (1213)
        self.reads = self.went_back = self.aborted = 0
        self.slowest = 0.0  # seconds the slowest answer took
        self.errors: list[str] = []
        self.last = (0, 0)
        self.halt = threading.Event()

    def run(self) -> None:
        query = select(func.count(), func.coalesce(func.sum(ledger.balances.c.entries), 0))
        try:
            while not self.halt.wait(self.every):
                asked = time.monotonic()
                try:
                    with self.db.read() as conn:
                        accounts, entries = conn.execute(query).one()
                except Exception as exc:  # a missing table is a failure of the test
                    if self.retry_aborts and _aborted(exc):
                        self.aborted += 1
                        continue
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    continue
                self.slowest = max(self.slowest, time.monotonic() - asked)
                seen = (int(accounts), int(entries))
                self.reads += 1
                if seen[0] < self.last[0] or seen[1] < self.last[1]:
                    self.went_back += 1
                self.last = max(self.last, seen)
        finally:
            self.db.dispose()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def _aborted(exc: BaseException) -> bool:
    """Whether ``exc`` is a transaction aborted as a deadlock (1213): on Galera, a read
    holding a table that a replicated ``RENAME TABLE`` renames."""
    orig = getattr(exc, "orig", None)
    return bool(orig is not None and orig.args and orig.args[0] == 1213)


class Traffic(threading.Thread):
    """Appends ledger traffic in small commits until stopped (new accounts each time: an
    account opened again starts from zero entries)."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.halt = threading.Event()
        self.rounds = 0

    def run(self) -> None:
        while not self.halt.is_set():
            self.rounds += 1
            seed_ledger(self.db, 20, seed=100 + self.rounds, prefix=f"t{self.rounds}")

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
