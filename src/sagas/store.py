"""Saga rows: versioned state per saga instance, and deadlines by partition and due time.

A state row is created once (a concurrent creation fails on the primary key) and then
updated only from the version read (``WHERE version = read``): two batches that changed
one saga at once cannot both commit; the loser raises :class:`ConcurrentUpdate` and
its batch is retried whole. A deadline lives in the partition its saga key hashes to;
due ones are found through the ``(tenant, saga, partition, due_at)`` index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Connection,
    Delete,
    Select,
    Update,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from messaging.errors import ConcurrentUpdate
from messaging.store.database import Database

_KEY_CHUNK = 500


@attrs.define(kw_only=True)
class SagaRow:
    """One saga instance as read at the start of a batch (``version`` None: not stored)."""

    key: str
    version: int | None
    state: str | None
    ended: bool


@attrs.define(frozen=True, kw_only=True)
class Deadline:
    """A deadline of one saga instance: ``message`` is delivered to it at ``due_at``."""

    key: str
    name: str
    partition: int
    due_at: float
    type: str
    payload: str


class SagaStore:
    """Reads and writes the saga and deadline rows of one saga consumer."""

    def __init__(self, db: Database, saga: str) -> None:
        self.db = db
        self.saga = saga
        self._sagas = db.schema.sagas
        self._deadlines = db.schema.deadlines
        # The statements run for many rows at once are built once and executed with a list
        # of parameters: building a statement costs more than running it for one row.
        d = self._deadlines
        self._take: Delete = delete(d).where(
            *self._of_saga(d),
            d.c.saga_key == bindparam("b_key"),
            d.c.name == bindparam("b_name"),
            d.c.due_at == bindparam("b_due_at"),
        )
        self._unschedule: Delete = delete(d).where(
            *self._of_saga(d),
            d.c.saga_key == bindparam("b_key"),
            d.c.name == bindparam("b_name"),
        )
        self._update: tuple[ColumnElement[float], Update] | None = None

    def _of_saga(self, table: Any) -> list[ColumnElement[bool]]:
        return [table.c.tenant == self.db.tenant, table.c.saga == self.saga]

    # -- state -------------------------------------------------------------------------

    def load(self, conn: Connection, keys: Iterable[str]) -> dict[str, SagaRow]:
        """The stored rows of ``keys`` (absent keys are not in the result)."""
        t = self._sagas
        wanted = sorted(set(keys))
        found: dict[str, SagaRow] = {}
        for start in range(0, len(wanted), _KEY_CHUNK):
            rows = conn.execute(
                select(t.c.saga_key, t.c.version, t.c.state, t.c.ended).where(
                    *self._of_saga(t), t.c.saga_key.in_(wanted[start : start + _KEY_CHUNK])
                )
            )
            for key, version, state, ended in rows:
                found[key] = SagaRow(key=key, version=version, state=state, ended=bool(ended))
        return found

    def save(self, conn: Connection, changes: Sequence[tuple[SagaRow, str, bool]]) -> None:
        """Store each ``(row, state, ended)``: the first version of a new instance, or the
        next version of a stored one. ConcurrentUpdate if any was started or moved on
        concurrently (the caller's transaction then rolls back whole, so the statements
        are batched, one for the new instances and one for the stored ones)."""
        t = self._sagas
        now = self.db.clock.now()
        new = [(row, state, ended) for row, state, ended in changes if row.version is None]
        stored = [(row, state, ended) for row, state, ended in changes if row.version is not None]
        if new:
            try:
                conn.execute(
                    insert(t).values(
                        tenant=self.db.tenant,
                        saga=self.saga,
                        started_at=now,
                        updated_at=now,
                    ),
                    [
                        {"saga_key": row.key, "version": 1, "state": state, "ended": ended}
                        for row, state, ended in new
                    ],
                )
            except IntegrityError as exc:
                keys = ", ".join(row.key for row, _, _ in new[:5])
                raise ConcurrentUpdate(
                    f"saga {self.saga}: one of {keys}{'...' if len(new) > 5 else ''} "
                    "was started concurrently"
                ) from exc
        if not stored:
            return
        if self._update is None or self._update[0] is not now:
            # Rebuilt only if the clock gives another expression (a manual clock's literal).
            self._update = (
                now,
                update(t)
                .where(
                    *self._of_saga(t),
                    t.c.saga_key == bindparam("b_key"),
                    t.c.version == bindparam("b_read"),
                )
                .values(
                    version=bindparam("b_next"),
                    state=bindparam("b_state"),
                    ended=bindparam("b_ended"),
                    updated_at=now,
                ),
            )
        updated = conn.execute(
            self._update[1],
            [
                {
                    "b_key": row.key,
                    "b_read": row.version,
                    "b_next": row.version + 1,  # type: ignore[operator]
                    "b_state": state,
                    "b_ended": ended,
                }
                for row, state, ended in stored
            ],
        ).rowcount
        if updated != len(stored):
            versions = ", ".join(f"{row.key} v{row.version}" for row, _, _ in stored[:5])
            raise ConcurrentUpdate(
                f"saga {self.saga}: {len(stored) - updated} of {len(stored)} instances changed "
                f"concurrently (read {versions}{'...' if len(stored) > 5 else ''})"
            )

    # -- deadlines ---------------------------------------------------------------------

    def schedule(self, conn: Connection, deadlines: Sequence[Deadline]) -> None:
        """Store ``deadlines``, each replacing one of the same name for the same saga
        instance (two batched statements, however many there are)."""
        if not deadlines:
            return
        conn.execute(self._unschedule, [{"b_key": d.key, "b_name": d.name} for d in deadlines])
        conn.execute(
            insert(self._deadlines).values(
                tenant=self.db.tenant, saga=self.saga, scheduled_at=self.db.clock.now()
            ),
            [
                {
                    "saga_key": d.key,
                    "name": d.name,
                    "partition_no": d.partition,
                    "due_at": d.due_at,
                    "type": d.type,
                    "payload": d.payload,
                }
                for d in deadlines
            ],
        )

    def cancel(self, conn: Connection, key: str, names: Sequence[str] | None = None) -> None:
        """Remove the deadlines ``names`` of saga instance ``key`` (all of them when None)."""
        d = self._deadlines
        where = [*self._of_saga(d), d.c.saga_key == key]
        if names is not None:
            where.append(d.c.name.in_(list(names)))
        conn.execute(delete(d).where(*where))

    def _due(self, partitions: Sequence[int], until: float | None) -> list[ColumnElement[bool]]:
        """Deadlines of ``partitions`` due now (and by ``until``, when given)."""
        d = self._deadlines
        where = [
            *self._of_saga(d),
            d.c.partition_no.in_(list(partitions)),
            d.c.due_at <= self.db.clock.now(),
        ]
        if until is not None:
            where.append(d.c.due_at <= until)
        return where

    def due_query(
        self, partitions: Sequence[int], limit: int, until: float | None = None
    ) -> Select[Any]:
        """The query of :meth:`due`: a range of the ``(tenant, saga, partition, due_at)``
        index per partition, never a scan of the table."""
        d = self._deadlines
        return (
            select(d.c.saga_key, d.c.name, d.c.partition_no, d.c.due_at, d.c.type, d.c.payload)
            .where(*self._due(partitions, until))
            .order_by(d.c.due_at)
            .limit(limit)
        )

    def due(
        self, conn: Connection, partitions: Sequence[int], limit: int, until: float | None = None
    ) -> list[Deadline]:
        """The deadlines of ``partitions`` due now (and by ``until``), earliest first, at
        most ``limit``."""
        rows = conn.execute(self.due_query(partitions, limit, until))
        return [
            Deadline(key=k, name=n, partition=p, due_at=float(due), type=t, payload=payload)
            for k, n, p, due, t, payload in rows
        ]

    def any_due(
        self, conn: Connection, partitions: Sequence[int], until: float | None = None
    ) -> bool:
        """Whether any deadline of ``partitions`` is due now (and by ``until``). Unordered,
        so it stops at the first due row it finds instead of sorting a backlog of them, as
        ``due(..., 1)`` would."""
        d = self._deadlines
        found = conn.execute(select(d.c.due_at).where(*self._due(partitions, until)).limit(1))
        return found.first() is not None

    def next_due_in(
        self, conn: Connection, partitions: Sequence[int], within: float
    ) -> float | None:
        """Seconds until the earliest deadline of ``partitions`` falls due, if one does
        within ``within`` seconds (None otherwise): an index range of that window only."""
        d = self._deadlines
        now = self.db.clock.now()
        found = conn.execute(
            select(func.min(d.c.due_at) - now).where(
                *self._of_saga(d),
                d.c.partition_no.in_(list(partitions)),
                d.c.due_at <= now + within,
            )
        ).scalar()
        return None if found is None else max(0.0, float(found))

    def take(self, conn: Connection, deadlines: Sequence[Deadline]) -> None:
        """Delete deadlines being delivered (one batched statement); ConcurrentUpdate if any
        changed since read (the caller's transaction then rolls back whole)."""
        if not deadlines:
            return
        deleted = conn.execute(
            self._take,
            [{"b_key": d.key, "b_name": d.name, "b_due_at": d.due_at} for d in deadlines],
        ).rowcount
        if deleted != len(deadlines):
            names = ", ".join(f"{d.key}/{d.name}" for d in deadlines[:5])
            raise ConcurrentUpdate(
                f"saga {self.saga}: {len(deadlines) - deleted} of {len(deadlines)} deadlines "
                f"({names}{'...' if len(deadlines) > 5 else ''}) changed while being delivered"
            )

    def pending(self, conn: Connection) -> int:
        """How many deadlines of this saga are scheduled."""
        d = self._deadlines
        return int(conn.execute(select(func.count()).where(*self._of_saga(d))).scalar_one())
