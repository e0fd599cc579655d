"""Saga rows: versioned state per saga instance, and deadlines by partition and due time.

A state row is created once (a concurrent creation fails on the primary key) and then
updated only from the version read (``WHERE version = read``): two batches that changed
one saga at once cannot both commit; the loser raises :class:`ConcurrentUpdate` and
its batch is retried whole. A deadline lives in the partition its saga key hashes to;
due ones are found through the ``(tenant, saga, partition, due_at)`` index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    Executable,
    Integer,
    Select,
    and_,
    bindparam,
    delete,
    func,
    insert,
    null,
    or_,
    select,
    tuple_,
    type_coerce,
    union_all,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.types import NullType

from messaging import ConcurrentUpdate, Database
from messaging.kinds import AS_GIVEN, cached_now, now_params
from messaging.kinds import fastpath as _fastpath
from sagas._rows import Deadline, Due, SagaRow, deadline_id
from sagas._statements import SQLITE_ROW, update_statement

_KEY_CHUNK = 500
_DUE_AT = attrgetter("due_at")
_new_tuple = tuple.__new__
"""``Deadline(*values)`` as ``_new_tuple(Deadline, values)``: a batch reads hundreds, made
without the named tuple's own Python-level constructor."""


class SagaStore:
    """Reads and writes the saga and deadline rows of one saga consumer.

    Every write of a batch is one statement for all its rows (a multi-row ``INSERT`` or
    upsert, a ``DELETE`` of a list of keys), whatever the batch's size: one round trip
    each on MySQL. Values are bound, times included (the batch's database time, read
    once), so PyMySQL sends an ``executemany`` of an ``INSERT`` as one multi-row statement.
    """

    def __init__(self, db: Database, saga: str, state_version: int = 1) -> None:
        self.db = db
        self.saga = saga
        self.state_version = state_version
        """The version states are written at (``@saga(state_version=)``)."""
        self._sagas = db.schema.sagas
        self._deadlines = db.schema.deadlines
        # Rows per statement that lists them (4 parameters a row): a whole batch (default
        # 500) in one statement, but on a SQLite older than 3.32 (at most 999 parameters).
        self._chunk = 250 if db.is_sqlite and sqlite3.sqlite_version_info < (3, 32) else 2_000
        # Statements run for many rows at once are built once (per database and saga: every
        # store of it shares them) and executed with a list of parameters: building a
        # statement costs more than running it for one row.
        built = db.statements.get((SagaStore, saga))
        if built is None:
            update, update_row, updated_per_row = update_statement(db, saga)
            built = (insert(self._sagas), insert(self._deadlines), update, update_row)
            built += (updated_per_row, {}, {})
            db.statements[(SagaStore, saga)] = built
        self._insert_sagas: Executable = built[0]
        self._insert_deadlines: Executable = built[1]
        self._update: Executable = built[2]
        self._update_row: tuple[str, ...] = built[3]
        """The names of an updated row's values, in the order :meth:`save` gives them."""
        self._updated_per_row: int = built[4]
        self._due_statements: dict[tuple[int, bool], CompoundSelect | Select[Any]] = built[5]
        self._listings: dict[tuple[str, int], Executable] = built[6]

    def _of_saga(self, table: Any) -> list[ColumnElement[bool]]:
        return [table.c.tenant == self.db.tenant, table.c.saga == self.saga]

    @staticmethod
    def _send(conn: Connection, statement: Executable, params: list[dict[str, Any]]) -> int:
        """Run ``statement`` for every parameter set (straight to the driver once learnt);
        return the row count."""
        return _fastpath.execute(conn, statement, params, direct=_fastpath.sends_directly(conn))

    def now(self, conn: Connection) -> float:
        """The database's time (the clock's), in seconds since the epoch."""
        return float(conn.execute(select(self.db.clock.now())).scalar_one())

    # -- state -------------------------------------------------------------------------

    def _listing(self, kind: str, size: int) -> Executable:
        """The statement ``kind`` (``load`` or ``take``) for ``size`` keys or deadlines, built
        once per size with a plain parameter per value (``k<i>``, ``n<i>``, ``d<i>``), so it
        goes straight to the driver once learnt (an expanding ``IN`` never does)."""
        statement = self._listings.get((kind, size))
        if statement is None:
            t, d = self._sagas, self._deadlines
            keys = [bindparam(f"k{i}", type_=t.c.saga_key.type) for i in range(size)]
            if kind == "load":  # ``ended`` as stored: no result processing, bool() below
                statement = select(
                    *(t.c.saga_key, t.c.version, t.c.state, type_coerce(t.c.ended, Integer)),
                    t.c.state_version,
                ).where(*self._of_saga(t), t.c.saga_key.in_(keys))
            else:
                rows = [
                    tuple_(keys[i], bindparam(f"n{i}"), bindparam(f"d{i}", type_=AS_GIVEN))
                    for i in range(size)
                ]
                statement = delete(d).where(
                    *self._of_saga(d),
                    d.c.saga_key.in_(keys),  # a range of the primary key
                    tuple_(d.c.saga_key, d.c.name, d.c.due_at).in_(rows),
                )
            self._listings[(kind, size)] = statement
        return statement

    def load(self, conn: Connection, keys: Iterable[str]) -> dict[str, SagaRow]:
        """The stored rows of ``keys`` (absent keys are not in the result)."""
        wanted = sorted(set(keys))
        found: dict[str, SagaRow] = {}
        direct = _fastpath.sends_directly(conn)
        for start in range(0, len(wanted), _KEY_CHUNK):
            chunk = _fastpath.padded(wanted[start : start + _KEY_CHUNK])
            params = {f"k{i}": key for i, key in enumerate(chunk)}
            for key, version, state, ended, state_version in _fastpath.fetch(
                conn, self._listing("load", len(chunk)), params, direct=direct
            ):
                found[key] = SagaRow(key, version, state, bool(ended), state_version)
        return found

    def save(
        self,
        conn: Connection,
        states: Mapping[str, str],
        rows: Mapping[str, SagaRow],
        ended: AbstractSet[str],
        now: float,
    ) -> None:
        """Store the saga instances ``states`` names (key → encoded state) as changed at
        ``now``, ``ended`` those of its keys: the first version of a new instance, the next
        of a stored one (``rows``: as read). ConcurrentUpdate if any was started or moved
        on concurrently (the caller's transaction then rolls back whole, so the statements
        are batched: one for the new instances, one for the stored)."""
        tenant, saga, state_version = self.db.tenant, self.saga, self.state_version
        sqlite = self._update_row is SQLITE_ROW
        new: list[dict[str, Any]] = []
        stored: list[tuple[Any, ...]] = []  # each the values of self._update_row
        for key, state in states.items():
            version = rows[key].version
            if version is None:
                new.append(
                    {
                        "tenant": tenant,
                        "saga": saga,
                        "saga_key": key,
                        "version": 1,
                        "state": state,
                        "state_version": state_version,
                        "ended": key in ended,
                        "started_at": now,
                        "updated_at": now,
                    }
                )
            elif sqlite:
                stored.append((version + 1, state, key in ended, now, state_version, key, version))
            else:
                row = (tenant, saga, key, version + 1, state, key in ended, now, now)
                stored.append((*row, state_version))
        if new:
            try:
                self._send(conn, self._insert_sagas, new)
            except IntegrityError as exc:
                keys = ", ".join(p["saga_key"] for p in new[:5])
                raise ConcurrentUpdate(
                    f"saga {saga}: one of {keys}{'...' if len(new) > 5 else ''} "
                    "was started concurrently"
                ) from exc
        if not stored:
            return
        direct = _fastpath.sends_directly(conn)
        counted = _fastpath.execute_rows(
            conn, self._update, self._update_row, stored, direct=direct
        )
        updated = counted // self._updated_per_row
        if counted != len(stored) * self._updated_per_row:
            key_at, next_at = self._update_row.index("b_key"), self._update_row.index("b_next")
            versions = ", ".join(f"{r[key_at]} v{r[next_at] - 1}" for r in stored[:5])
            raise ConcurrentUpdate(
                f"saga {saga}: {len(stored) - updated} of {len(stored)} instances changed "
                f"concurrently (read {versions}{'...' if len(stored) > 5 else ''})"
            )

    # -- deadlines ---------------------------------------------------------------------

    def schedule(self, conn: Connection, deadlines: Sequence[Deadline], now: float) -> None:
        """Store ``deadlines`` as scheduled at ``now``; each replaces one of the same name for
        the same saga instance (two statements, however many there are)."""
        if not deadlines:
            return
        self.unschedule(conn, pairs=[(d.key, d.name) for d in deadlines])
        tenant, saga = self.db.tenant, self.saga
        self._send(
            conn,
            self._insert_deadlines,
            [
                {
                    "tenant": tenant,
                    "saga": saga,
                    "saga_key": d.key,
                    "name": d.name,
                    "partition_no": d.partition,
                    "due_at": d.due_at,
                    "type": d.type,
                    "payload": d.payload,
                    "payload_version": d.payload_version,
                    "scheduled_at": now,
                }
                for d in deadlines
            ],
        )

    def unschedule(
        self,
        conn: Connection,
        keys: Sequence[str] = (),
        pairs: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Remove every deadline of the saga instances ``keys`` and those named by
        ``(key, name)`` ``pairs`` (one statement per chunk of them)."""
        d = self._deadlines
        size = self._chunk
        for start in range(0, max(len(keys), len(pairs)), size):
            some_keys, some_pairs = keys[start : start + size], pairs[start : start + size]
            matches = []
            if some_keys:
                matches.append(d.c.saga_key.in_(some_keys))
            if some_pairs:
                matches.append(tuple_(d.c.saga_key, d.c.name).in_(some_pairs))
            conn.execute(delete(d).where(*self._of_saga(d), or_(*matches)))

    def _due(
        self, partitions: Sequence[Any], until: Any, now: Any = None, parked: Sequence[str] = ()
    ) -> list[ColumnElement[bool]]:
        """Deadlines of ``partitions`` due now (and by ``until``, when given), but those of
        the ``parked`` instances (they wait for a retry)."""
        d = self._deadlines
        where = [
            *self._of_saga(d),
            d.c.partition_no == partitions[0]
            if len(partitions) == 1
            else d.c.partition_no.in_(list(partitions)),
            d.c.due_at <= (self.db.clock.now() if now is None else now),
        ]
        if until is not None:
            where.append(d.c.due_at <= until)
        if parked:
            where.append(d.c.saga_key.not_in(sorted(parked)))
        return where

    def _due_statement(
        self, count: int, until: bool, parked: Sequence[str] = ()
    ) -> CompoundSelect | Select[Any]:
        """The query of :meth:`due` for ``count`` partitions, built once: ``UNION ALL`` of one
        range of the ``(tenant, saga, partition, due_at)`` index per partition, read in
        order up to its quota (parameters ``p<i>``, ``q<i>`` and ``until``), each deadline
        with its saga's stored row, after one row holding the database's time. Never a
        sort of the whole overdue backlog, as one ``ORDER BY due_at`` over several
        partitions is. Built anew (never kept) with ``parked`` instances left out."""
        shape = (count, until)
        if parked or shape not in self._due_statements:
            d = self._deadlines
            cut = bindparam("until", type_=d.c.due_at.type) if until else None
            now = cached_now(self.db.clock)  # a manual clock's is bound per read
            # due_at and the server's clock as the driver gives them (float() below): no
            # result processing (a bound value stays typed: it renders as a literal)
            due_at = type_coerce(d.c.due_at, NullType())
            clock = now if isinstance(now, BindParameter) else type_coerce(now, NullType())
            t = self._sagas
            columns = (
                *(d.c.saga_key, d.c.name, d.c.partition_no, due_at, d.c.type, d.c.payload),
                d.c.payload_version,
                *(t.c.version, t.c.state, type_coerce(t.c.ended, Integer), t.c.state_version),
            )
            # each deadline with its saga's stored row: one read instead of two
            joined = d.outerjoin(
                t,
                and_(t.c.tenant == d.c.tenant, t.c.saga == d.c.saga, t.c.saga_key == d.c.saga_key),
            )
            parts = [
                select(*columns)
                .select_from(joined)
                .where(
                    *self._due([bindparam(f"p{i}", type_=d.c.partition_no.type)], cut, now, parked)
                )
                .order_by(d.c.due_at)
                .limit(bindparam(f"q{i}", type_=Integer()))
                for i in range(count)
            ]
            # The clock once, in a row of its own (no saga key), not once per deadline.
            clock_row = select(*[null()] * 3, clock, *[null()] * (len(columns) - 4))
            statement: CompoundSelect
            if self.db.is_sqlite:  # no parenthesized parts there: each a subquery
                statement = union_all(clock_row, *[q.subquery().select() for q in parts])
            else:  # parenthesized: MySQL streams them, no temporary tables
                statement = union_all(clock_row, *parts)
            if parked:
                return statement
            self._due_statements[shape] = statement
        return self._due_statements[shape]

    def _due_params(self, quotas: Mapping[int, int], until: float | None) -> dict[str, Any]:
        params: dict[str, Any] = now_params(self.db.clock)
        if until is not None:
            params["until"] = until
        for i, (partition, quota) in enumerate(quotas.items()):
            params[f"p{i}"], params[f"q{i}"] = partition, quota
        return params

    def due_query(
        self, quotas: Mapping[int, int], until: float | None = None
    ) -> CompoundSelect | Select[Any]:
        """The query :meth:`due` sends for these quotas (partition → at most how many)."""
        statement = self._due_statement(len(quotas), until is not None)
        return statement.params(self._due_params(quotas, until))

    def due(
        self,
        conn: Connection,
        partitions: Sequence[int],
        limit: int,
        until: float | None = None,
        parked: Sequence[str] = (),
    ) -> Due:
        """Deadlines of ``partitions`` due now (and by ``until``), at most ``limit``, earliest
        first: of each partition its earliest ones (so of each saga instance, in due order),
        of the partitions in the same read an even share each; a share a partition leaves
        unused goes to those that filled theirs, in at most two more reads; the time of
        the first read that found any (the database's; 0.0 if none did), and the stored
        rows of their saga instances, read with them; none of the ``parked`` instances'."""
        quotas = dict.fromkeys(partitions, max(1, -(-limit // max(1, len(partitions)))))
        found: dict[int, list[Deadline]] = {}
        sagas: dict[str, SagaRow] = {}
        direct, now = _fastpath.sends_directly(conn), 0.0
        for _ in range(3):
            read: dict[int, list[Deadline]] = {p: [] for p in quotas}
            statement = self._due_statement(len(quotas), until is not None, parked)
            params = self._due_params(quotas, until)
            rows = _fastpath.fetch(conn, statement, params, direct=direct and not parked)
            clock = 0.0
            for k, n, p, due, t, payload, shape, version, state, ended, state_version in rows:
                if k is None:  # the clock's row
                    clock = float(due)
                    continue
                read[p].append(_new_tuple(Deadline, (k, n, p, float(due), t, payload, shape)))
                if k not in sagas:  # no stored row: version None, like a new instance's
                    row = (k, version, state, bool(ended), state_version or 1)
                    sagas[k] = _new_tuple(SagaRow, row)
            if any(read.values()):
                now = now or clock
            found.update(read)
            left = limit - sum(map(len, found.values()))
            full = [p for p in quotas if len(read[p]) == quotas[p]]
            if left <= 0 or not full:
                break
            more = -(-left // len(full))
            quotas = {p: quotas[p] + more for p in full}
        every = sorted(chain.from_iterable(found.values()), key=_DUE_AT)
        # a prefix in due order: still each partition's earliest
        return Due(deadlines=every[:limit], now=now, sagas=sagas)

    def any_due(
        self,
        conn: Connection,
        partitions: Sequence[int],
        until: float | None = None,
        parked: Sequence[str] = (),
    ) -> bool:
        """Whether any deadline of ``partitions`` (but the ``parked`` instances') is due now
        (and by ``until``). Unordered, so it stops at the first due row it finds instead of
        sorting a backlog of them, as ``due(..., 1)`` would."""
        d = self._deadlines
        where = self._due(partitions, until, parked=parked)
        found = conn.execute(select(d.c.due_at).where(*where).limit(1))
        return found.first() is not None

    def next_due_in(
        self, conn: Connection, partitions: Sequence[int], within: float, parked: Sequence[str] = ()
    ) -> float | None:
        """Seconds until the earliest deadline of ``partitions`` (but the ``parked``
        instances') falls due, if one does within ``within`` seconds (None otherwise): an
        index range of that window only."""
        d = self._deadlines
        now = self.db.clock.now()
        where = [*self._of_saga(d), d.c.partition_no.in_(list(partitions))]
        if parked:
            where.append(d.c.saga_key.not_in(sorted(parked)))
        found = conn.execute(
            select(func.min(d.c.due_at) - now).where(*where, d.c.due_at <= now + within)
        ).scalar()
        return None if found is None else max(0.0, float(found))

    def take(self, conn: Connection, deadlines: Sequence[Deadline]) -> None:
        """Delete deadlines being delivered (one statement per chunk of them, each naming
        the rows by key, name and due time); ConcurrentUpdate if any is gone or changed
        since read: the rows deleted must be exactly as many as asked for (the caller's
        transaction then rolls back whole)."""
        deleted = 0
        direct = _fastpath.sends_directly(conn)
        for start in range(0, len(deadlines), self._chunk):
            chunk = _fastpath.padded(deadlines[start : start + self._chunk])
            named = _fastpath.numbered(("k", "n", "d"), len(chunk))
            params = dict(zip(named, chain.from_iterable(map(deadline_id, chunk)), strict=True))
            statement = self._listing("take", len(chunk))
            deleted += _fastpath.execute(conn, statement, [params], direct=direct)
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
