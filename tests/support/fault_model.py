"""The sequential model the fault tests compare with: what applying every message exactly
once, in order, leaves in the fault application's tables (see ``fault_app``); and the
numbered traffic they append."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable

import attrs
import fault_app
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from messaging import Database, MessageStore
from messaging.store._retry import lock_conflict

SOURCES = [f"src-{i}" for i in range(6)]
"""The sources of the numbered traffic."""
SINGLE_OWNER = """\
projections:
  consumers:
    fault-seq-single: {distribution: single-owner}
"""
"""Configuration that makes ``fault-seq-single`` single-owner."""


def append_numbered(db: Database, sources: Iterable[str], start: int, count: int) -> int:
    """Append seq ``start`` … ``start + count - 1`` of each source (one transaction)."""
    store = MessageStore(db)
    written = 0
    with db.transaction() as conn:
        for seq in range(start, start + count):
            for source in sources:
                store.append(conn, fault_app.TOPIC, source, [fault_app.Numbered(source, seq)])
                written += 1
    return written


@attrs.define(frozen=True)
class Tally:
    """How a consumer's applied rows compare with the sequential model."""

    applied: int
    duplicates: int
    reordered: int
    lost: int

    @property
    def exact(self) -> bool:
        """Every message applied once, in order."""
        return self.duplicates == self.reordered == self.lost == 0


def tally(db: Database, consumer: str, expected: dict[str, int]) -> Tally:
    """Compare ``consumer``'s rows with each source's seq 1..expected[source], in order."""
    t = fault_app.applied
    with db.read() as conn:
        rows = conn.execute(
            select(t.c.source, t.c.seq).where(t.c.consumer == consumer).order_by(t.c.id)
        ).all()
    seen: dict[str, list[int]] = {}
    for source, seq in rows:
        seen.setdefault(source, []).append(seq)
    duplicates = reordered = lost = 0
    for source in set(seen) | set(expected):
        seqs = seen.get(source, [])
        duplicates += len(seqs) - len(set(seqs))
        reordered += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
        lost += len(set(range(1, expected.get(source, 0) + 1)) - set(seqs))
    return Tally(applied=len(rows), duplicates=duplicates, reordered=reordered, lost=lost)


def effects(db: Database, consumer: str) -> Counter[str]:
    """How many times ``consumer`` left its effect, per job id."""
    t = fault_app.effects
    with db.read() as conn:
        return Counter(conn.execute(select(t.c.job_id).where(t.c.consumer == consumer)).scalars())


def message_ids(db: Database, topic: str) -> Counter[str]:
    """How many stored messages of ``topic`` carry each message id."""
    m = db.schema.messages
    with db.read() as conn:
        headers = conn.execute(
            select(m.c.headers).where(m.c.tenant == db.tenant, m.c.topic == topic)
        ).scalars()
        return Counter(json.loads(h or "{}").get("message-id", "") for h in headers)


class Traffic:
    """Appends one numbered message per source (seq = round) every 20 ms, in a thread, until
    stopped. A lock conflict (a deadlock or Galera certification conflict; a lock wait
    that ran out behind a frozen instance's transaction) certainly failed: the round is
    appended again, as an application's appender would; any other error ends the traffic
    and is raised by :meth:`stop`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.rounds = 0
        self.committed: list[float] = []
        """When (monotonic) each round committed."""
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.02):
                try:
                    append_numbered(self.db, SOURCES, self.rounds + 1, 1)
                except OperationalError as exc:
                    if lock_conflict(exc) is None:
                        raise
                    continue
                self.rounds += 1
                self.committed.append(time.monotonic())
        except BaseException as exc:
            self._error = exc

    def first_commit_after(self, moment: float) -> float | None:
        """When the first round that committed after ``moment`` did (None: none yet)."""
        return next((t for t in self.committed if t > moment), None)

    def stop(self) -> int:
        """Stop appending; return the number of rounds appended."""
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.rounds
