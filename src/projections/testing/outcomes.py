"""Commits of unknown outcome for simulated instances: a view of the shared database whose
next batch transaction commits (or rolls back) and then raises what a connection lost
during ``COMMIT`` raises, so that the worker cannot tell which happened.

The transaction is the real one on the real database; only its answer is replaced by the
error :func:`messaging.is_ambiguous` classifies as of unknown outcome.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import attrs
import pymysql
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from messaging import Database, MessageStore
from messaging.kinds import POSITION, Claim, ConsumerSpec
from messaging.operations import PARTITION_HASH, Ownership

LOST_DURING_COMMIT = 2013
"""MySQL's "Lost connection to MySQL server during query", which PyMySQL raises when the
connection drops while ``COMMIT`` is under way."""


_BEFORE = "projections_testing_before"
"""``connection.info`` of a batch's transaction: its consumer, and the checkpoints as its
last commit left them (what a lost outcome is counted from)."""


@attrs.define(frozen=True)
class Moved:
    """One partition a batch moved: under ``epoch``, its checkpoint from ``before`` to
    ``after``."""

    epoch: int
    before: int
    after: int


@attrs.define(frozen=True)
class UnknownOutcome:
    """A batch of ``consumer`` whose outcome the worker did not learn: the partitions it
    moved, and whether it ``committed`` (else it rolled back)."""

    consumer: str
    moved: Mapping[int, Moved]
    committed: bool

    def messages(self, store: MessageStore, spec: ConsumerSpec) -> int:
        """How many messages of ``spec`` the batch held."""
        moved = self.moved
        with store.db.read() as conn:
            rows = store.read_batch(
                conn,
                spec.topics,
                partitions={p: m.before for p, m in moved.items()},
                partition_count=spec.partitions,
                types=spec.stored_type_names(),  # the old names too
                limit=max(m.after for m in moved.values()) - min(m.before for m in moved.values()),
            )
        n = spec.partitions
        return sum(row[POSITION] <= moved[row[PARTITION_HASH] % n].after for row in rows)


def unknown_outcome_error(db: Database) -> OperationalError:
    """What SQLAlchemy raises when the connection drops during ``COMMIT``: PyMySQL's 2013 on
    MySQL/MariaDB, an invalidated connection on SQLite (where it cannot really happen).
    :func:`messaging.is_ambiguous` classifies both as of unknown outcome."""
    if db.is_sqlite:
        lost = sqlite3.OperationalError("the connection was lost during COMMIT (simulated)")
        return OperationalError("COMMIT", None, lost, connection_invalidated=True)
    error = pymysql.err.OperationalError(
        LOST_DURING_COMMIT, "Lost connection to MySQL server during query (simulated)"
    )
    return OperationalError("COMMIT", None, error)


class _RollBack(Exception):
    """Rolls the armed transaction back (it never reached the database)."""


class OutcomeLosingDatabase(Database):
    """One simulated instance's view of ``db`` (the same engine, schema, clock and tenant).

    After :meth:`lose_next_outcome`, the next transaction of a consumer's batch that moves
    a checkpoint commits (``committed=True``: only the acknowledgement is lost) or rolls
    back (``committed=False``: the connection dropped before ``COMMIT`` reached the
    server); either way ``on_lost`` is told what it moved and the transaction raises
    :func:`unknown_outcome_error`. One such transaction per call; other transactions
    (heartbeats, claims, deadline deliveries, reads) are untouched. After
    :meth:`lose_transaction`, the n-th transaction of any kind from then on loses its
    outcome the same way (a claim, a release, a step of a cutover, ...).
    """

    def __init__(self, db: Database, on_lost: Callable[[UnknownOutcome], None]) -> None:
        self.__dict__.update(vars(db))  # shares db's engine: no second pool, no second schema
        self.on_lost = on_lost
        self._committed: bool | None = None
        self._nth: tuple[int, bool] | None = None

    def lose_transaction(self, nth: int, *, committed: bool = True) -> None:
        """Lose the outcome of the ``nth`` transaction from now (1: the next), whatever it
        does; :meth:`keep_outcomes` undoes it."""
        self._nth = (nth, committed)

    def lose_next_outcome(self, *, committed: bool = True) -> None:
        """Lose the outcome of the next batch transaction that moves a checkpoint."""
        self._committed = committed

    def keep_outcomes(self) -> None:
        """Lose nothing more (undo :meth:`lose_next_outcome` and :meth:`lose_transaction`
        if no transaction came)."""
        self._committed = None
        self._nth = None

    @contextmanager
    def transaction(
        self, *, consumer: str | None = None, deferred: bool = False
    ) -> Iterator[Connection]:
        if self._nth is not None:
            nth, kept = self._nth
            self._nth = (nth - 1, kept) if nth > 1 else None
            if nth == 1:
                try:
                    with super().transaction(consumer=consumer, deferred=deferred) as conn:
                        yield conn
                        if not kept:
                            raise _RollBack
                except _RollBack:
                    pass
                raise unknown_outcome_error(self)
        committed = self._committed
        if committed is None or consumer is None:
            with super().transaction(consumer=consumer, deferred=deferred) as conn:
                yield conn
            return
        lost: UnknownOutcome | None = None
        try:
            with super().transaction(consumer=consumer, deferred=deferred) as conn:
                conn.info[_BEFORE] = consumer, self._checkpoints(conn, consumer)
                try:
                    yield conn
                finally:
                    _, before = conn.info.pop(_BEFORE)
                moved = {
                    partition: Moved(epoch, before[partition][1], checkpoint)
                    for partition, (epoch, checkpoint) in self._checkpoints(conn, consumer).items()
                    if checkpoint > before.get(partition, (epoch, checkpoint))[1]
                }
                if moved:
                    self._committed = None
                    lost = UnknownOutcome(consumer, moved, committed)
                    if not committed:
                        raise _RollBack
        except _RollBack:
            pass
        if lost is not None:
            self.on_lost(lost)
            raise unknown_outcome_error(self)

    def commit_and_read_on(self, conn: Connection) -> None:
        """A commit between two messages of a batch: what the rest of it commits (and may
        lose the outcome of) is counted from the checkpoints it left."""
        super().commit_and_read_on(conn)
        if _BEFORE in conn.info:
            consumer, _ = conn.info[_BEFORE]
            conn.info[_BEFORE] = consumer, self._checkpoints(conn, consumer)

    def _checkpoints(self, conn: Connection, consumer: str) -> dict[int, tuple[int, int]]:
        """Partition → (epoch, checkpoint) of ``consumer``, as ``conn`` sees them."""
        rows = Ownership(self).partitions(conn, [consumer])
        return {row.partition: (row.epoch, row.checkpoint) for row in rows}


class ProcessDied(BaseException):
    """The simulated process died: not an error any retry or halt may catch."""


class DiesAtCommit(Ownership):
    """The ownership of a process that dies when it commits a checkpoint."""

    def __init__(self, ownership: Ownership) -> None:
        super().__init__(ownership.db)

    def commit_checkpoint(
        self,
        conn: Connection,
        consumer: str,
        instance_id: str,
        claims: Mapping[int, Claim],
        position: int,
    ) -> None:
        raise ProcessDied
