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
from sqlalchemy import Connection, Select, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from messaging.database import Database
from messaging.errors import ConcurrentUpdate

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

    def save(self, conn: Connection, row: SagaRow, state: str, *, ended: bool) -> None:
        """Store ``state`` as the next version of ``row``; ConcurrentUpdate if it moved on."""
        t = self._sagas
        now = self.db.clock.now()
        if row.version is None:
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(t).values(
                            tenant=self.db.tenant,
                            saga=self.saga,
                            saga_key=row.key,
                            version=1,
                            state=state,
                            ended=ended,
                            started_at=now,
                            updated_at=now,
                        )
                    )
            except IntegrityError as exc:
                raise ConcurrentUpdate(
                    f"saga {self.saga}/{row.key} was started concurrently"
                ) from exc
            return
        updated = conn.execute(
            update(t)
            .where(*self._of_saga(t), t.c.saga_key == row.key, t.c.version == row.version)
            .values(version=row.version + 1, state=state, ended=ended, updated_at=now)
        ).rowcount
        if updated != 1:
            raise ConcurrentUpdate(
                f"saga {self.saga}/{row.key} changed concurrently (read version {row.version})"
            )

    # -- deadlines ---------------------------------------------------------------------

    def schedule(self, conn: Connection, deadline: Deadline) -> None:
        """Store ``deadline``, replacing one of the same name for the same saga instance."""
        self.cancel(conn, deadline.key, [deadline.name])
        conn.execute(
            insert(self._deadlines).values(
                tenant=self.db.tenant,
                saga=self.saga,
                saga_key=deadline.key,
                name=deadline.name,
                partition_no=deadline.partition,
                due_at=deadline.due_at,
                type=deadline.type,
                payload=deadline.payload,
                scheduled_at=self.db.clock.now(),
            )
        )

    def cancel(self, conn: Connection, key: str, names: Sequence[str] | None = None) -> None:
        """Remove the deadlines ``names`` of saga instance ``key`` (all of them when None)."""
        d = self._deadlines
        where = [*self._of_saga(d), d.c.saga_key == key]
        if names is not None:
            where.append(d.c.name.in_(list(names)))
        conn.execute(delete(d).where(*where))

    def due_query(self, partitions: Sequence[int], limit: int) -> Select[Any]:
        """The query of :meth:`due`: a range of the ``(tenant, saga, partition, due_at)``
        index per partition, never a scan of the table."""
        d = self._deadlines
        return (
            select(d.c.saga_key, d.c.name, d.c.partition_no, d.c.due_at, d.c.type, d.c.payload)
            .where(
                *self._of_saga(d),
                d.c.partition_no.in_(list(partitions)),
                d.c.due_at <= self.db.clock.now(),
            )
            .order_by(d.c.due_at)
            .limit(limit)
        )

    def due(self, conn: Connection, partitions: Sequence[int], limit: int) -> list[Deadline]:
        """The deadlines of ``partitions`` due now, earliest first, at most ``limit``."""
        rows = conn.execute(self.due_query(partitions, limit))
        return [
            Deadline(key=k, name=n, partition=p, due_at=float(due), type=t, payload=payload)
            for k, n, p, due, t, payload in rows
        ]

    def take(self, conn: Connection, deadline: Deadline) -> None:
        """Delete a deadline being delivered; ConcurrentUpdate if it changed since read."""
        d = self._deadlines
        deleted = conn.execute(
            delete(d).where(
                *self._of_saga(d),
                d.c.saga_key == deadline.key,
                d.c.name == deadline.name,
                d.c.due_at == deadline.due_at,
            )
        ).rowcount
        if deleted != 1:
            raise ConcurrentUpdate(
                f"deadline {deadline.name!r} of saga {self.saga}/{deadline.key} changed "
                "while being delivered"
            )

    def pending(self, conn: Connection) -> int:
        """How many deadlines of this saga are scheduled."""
        d = self._deadlines
        return int(conn.execute(select(func.count()).where(*self._of_saga(d))).scalar_one())
