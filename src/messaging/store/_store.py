"""The message store: append to topics inside the caller's transaction, read in position order.

Positions never skip. Every append takes this tenant's row in the ``positions`` table
with an ``UPDATE`` before it inserts, and holds that row lock until its transaction
commits. Position assignment is therefore serialized per tenant, and a transaction that got
a higher position commits strictly after every one that got a lower position: a reader that
sees position *n* already sees every position below it, so a consumer can checkpoint *n*
without ever skipping a message that commits late. (On SQLite the single writer lock gives
the same order.) The price is that appends of one tenant commit one at a time; keep the
work after an append in the same transaction short.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    and_,
    bindparam,
    insert,
    literal,
    or_,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from messaging._errors import VersionConflict
from messaging._messages import MESSAGE_ID_HEADER, Envelope, MessageRegistry
from messaging._messages import registry as default_registry
from messaging._settings import ConflictRetrySettings
from messaging.store import _fastpath
from messaging.store._clock import cached_now, now_params
from messaging.store._committed import append_committed
from messaging.store._database import Database
from messaging.store._reserver import Reserver
from messaging.store._rows import (
    INSERTED,
    TYPE,
    NewMessage,
    StoredRow,
    check_id,
    headers_json,
    is_plain_id,
    partition_hash,
    registered_message,
)
from messaging.store._schema import AS_GIVEN
from messaging.store._tokens import Appended, ConsistencyToken, Sent, token_of

_QUERY_CACHE_SIZE = 64
_type_of = itemgetter(TYPE)


class MessageStore:
    """Appends messages and reads them back by topic, position and partition."""

    def __init__(self, db: Database, registry: MessageRegistry = default_registry) -> None:
        self.db = db
        self.registry = registry
        self._messages = db.schema.messages
        self._positions = db.schema.positions
        p = self._positions
        self._head = select(p.c.last_position).where(p.c.tenant == bindparam("t"))
        m = self._messages
        self._full_columns: tuple[Any, ...] = (
            m.c.position,
            m.c.topic,
            m.c.source,
            m.c.version,
            m.c.type,
            m.c.partition_hash,
            m.c.recorded_at,
            m.c.headers,
            m.c.payload_version,
            m.c.payload,
        )
        self._batch_columns: tuple[Any, ...] = (
            m.c.position,
            m.c.type,
            m.c.payload,
            m.c.payload_version,
        )
        self._hashed_columns = (*self._batch_columns, m.c.partition_hash)
        self.sourced_columns = (*self._hashed_columns, m.c.source)
        """The columns of a batch read with the partition hash and the source."""
        self._queries: dict[Any, Select[Any]] = {}
        self._handled: dict[tuple[tuple[str, ...], tuple[str, ...]], frozenset[str] | None] = {}
        """Per (topics, types) of :meth:`read_batch`: the types, while reads without the
        types filter found no other; None once one did (the filter runs in SQL since)."""
        # The time bound as it is (a float read from the database's clock; a Float's
        # conversion would keep SQLite's rows from going to the driver as built below)
        self._insert = insert(m).values(recorded_at=bindparam("recorded_at", type_=AS_GIVEN))
        self._reserver = Reserver(db)
        self._topic_index = f"{db.schema.prefix}ix_messages_topic"
        p = self._positions
        self._settled = (
            select(cached_now(db.clock))
            .where(p.c.tenant == bindparam("t"))
            .with_for_update(read=True)
        )

    # -- appending ---------------------------------------------------------------------

    def append(
        self,
        conn: Connection,
        topic: str,
        source: str,
        messages: Sequence[object],
        *,
        expected_version: int | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Appended:
        """Append messages of one source inside ``conn``'s transaction; return their positions
        (a list) with the consistency token of the append (``.token``: wait on it with
        :func:`~messaging.wait_for` once the transaction committed).

        With ``expected_version`` the append succeeds only if the source's current
        version in this topic is exactly that (0 for a new source); otherwise it
        raises :class:`VersionConflict` and the caller's transaction should roll back.
        """
        return self.append_encoded(
            conn,
            self._encoded(topic, source, messages, headers),
            expected_versions={(topic, source): expected_version},
        )

    def append_committed(
        self,
        topic: str,
        source: str,
        messages: Sequence[object],
        *,
        expected_version: int | None = None,
        headers: Mapping[str, Any] | None = None,
        retry: ConflictRetrySettings | None = None,
    ) -> Appended:
        """Append messages of one source in a transaction of their own, commit it, and
        return their positions and token (wait on ``.token`` at once). Retried like
        ``projections append``: certification conflicts, deadlocks and lock waits are
        retried (``retry``: the consumers' ``conflict-retry`` settings, at least 50
        retries); a lost acknowledgement of the commit is resolved without storing the
        messages twice (each gets a ``message-id`` header); a database that does not
        answer raises :class:`~messaging._errors.Unanswered` within two answer bounds.
        ``expected_version`` as in :meth:`append`: another writer's conflict raises
        :class:`VersionConflict` at once."""
        return append_committed(
            self,
            self._encoded(topic, source, messages, headers),
            expected_versions={(topic, source): expected_version},
            retry=retry,
        )

    def _encoded(
        self,
        topic: str,
        source: str,
        messages: Sequence[object],
        headers: Mapping[str, Any] | None,
    ) -> list[NewMessage]:
        registry = self.registry
        encoded = []
        for message in messages:
            type_name, payload = registry.encode(message)
            encoded.append(
                registered_message(
                    topic, source, type_name, payload, headers, registry.version_of(type_name)
                )
            )
        return encoded

    def send(
        self,
        conn: Connection,
        destination: str,
        message: object,
        *,
        key: str | None = None,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Sent:
        """Send ``message`` to the route consumer of ``destination`` inside ``conn``'s
        transaction (an outbox: it exists only if that transaction commits); return its id
        (a string) with the consistency token of the send (``.token``).

        ``key`` is the partition key (by default the message id, which spreads messages
        over every partition); messages with one key are handled in order. Give
        ``message_id`` to make a retried send recognisable to an idempotent receiver.
        """
        message_id = message_id or uuid.uuid4().hex
        outgoing = self.outgoing(
            destination, message, key=key, message_id=message_id, headers=headers
        )
        return Sent(message_id, self.append_encoded(conn, [outgoing]).token)

    def outgoing(
        self,
        destination: str,
        message: object,
        *,
        key: str | None,
        message_id: str,
        headers: Mapping[str, Any] | None = None,
    ) -> NewMessage:
        """``message`` encoded for ``destination``: its source is the partition key; its
        headers are ``headers`` and ``message-id`` (which wins over one in ``headers``)."""
        if not is_plain_id(message_id):
            check_id("message id", message_id)
        return self.outgoing_as(destination, message, key, message_id, headers)

    def outgoing_as(
        self,
        destination: str,
        message: object,
        key: str | None,
        message_id: str,
        headers: Mapping[str, Any] | None,
    ) -> NewMessage:
        """:meth:`outgoing` with a ``message_id`` already checked (or derived): a handler's
        sends, thousands a batch."""
        registry = self.registry
        type_name, payload = registry.encode(message)
        return registered_message(
            destination,
            key if key is not None else message_id,
            type_name,
            payload,
            {**headers, MESSAGE_ID_HEADER: message_id}
            if headers
            else {MESSAGE_ID_HEADER: message_id},
            registry.version_of(type_name),
        )

    def append_encoded(
        self,
        conn: Connection,
        messages: Sequence[NewMessage],
        *,
        expected_versions: Mapping[tuple[str, str], int | None] | None = None,
    ) -> Appended:
        """Append already-encoded messages (any topics and sources) in order; return their
        positions with the token of the append (:class:`Appended`)."""
        if not messages:
            return Appended([], ConsistencyToken(self.db.tenant, ()))
        expected_versions = expected_versions or {}
        # Reserve first: holding the tenant's counter row, no other append can change a
        # source's version until we commit, so the versions read below are current.
        first, now, versions = self._reserver.reserve(
            conn, len(messages), {(m.topic, m.source) for m in messages}
        )
        for key, expected in expected_versions.items():
            if expected is not None and versions.get(key, 0) != expected:
                raise VersionConflict(
                    topic=key[0], source=key[1], expected=expected, actual=versions.get(key, 0)
                )
        tenant, rows = self.db.tenant, []
        for offset, message in enumerate(messages):
            key = (message.topic, message.source)
            versions[key] = version = versions.get(key, 0) + 1
            rows.append(
                (
                    tenant,
                    first + offset,
                    message.topic,
                    message.source,
                    version,
                    message.type,
                    message.payload,
                    headers_json(message.headers),
                    partition_hash(message.source),
                    now,
                    message.payload_version,
                )
            )
        try:
            # One multi-row INSERT on MySQL; SQLAlchemy's per-row work skipped once learnt.
            direct = _fastpath.sends_directly(conn)
            _fastpath.execute_rows(conn, self._insert, INSERTED, rows, direct=direct)
        except IntegrityError as exc:
            # Only reachable when the caller's snapshot hid a concurrent append (REPEATABLE READ).
            first_key = (messages[0].topic, messages[0].source)
            raise VersionConflict(
                topic=first_key[0],
                source=first_key[1],
                expected=expected
                if (expected := expected_versions.get(first_key)) is not None
                else versions.get(first_key, 0),
                actual=None,
            ) from exc
        # the messages as appended (a caller may reuse its list), their token made if asked
        made = partial(token_of, tenant, first, tuple(messages))
        return Appended(range(first, first + len(rows)), made)

    # -- reading -----------------------------------------------------------------------

    def read(
        self,
        conn: Connection,
        topics: Sequence[str],
        *,
        after: int = 0,
        partitions: Mapping[int, int] | None = None,
        partition_count: int = 1,
        types: Sequence[str] | None = None,
        limit: int = 500,
    ) -> Sequence[Any]:
        """Messages of ``topics`` in position order, at most ``limit``.

        Without ``partitions``: every message after ``after``. With ``partitions``
        (partition number → its checkpoint), only messages of those partitions of a
        ``partition_count``-way split, each after its own checkpoint. The partition
        filter runs in SQL, and so does the ``types`` filter (stored type names).
        Rows have the :class:`~messaging._messages.Envelope` fields in order, then the
        payload.
        """
        query = self._query(
            self._full_columns, topics, after, partitions, partition_count, types, limit
        )
        return [] if query is None else conn.execute(*query).all()

    def read_batch(
        self,
        conn: Connection,
        topics: Sequence[str],
        *,
        after: int = 0,
        partitions: Mapping[int, int] | None = None,
        partition_count: int = 1,
        types: Sequence[str] | None = None,
        limit: int = 500,
        hashes: bool = True,
        sources: bool = False,
    ) -> list[StoredRow]:
        """What :meth:`read` selects, as :data:`StoredRow` tuples: all a consumer needs to
        apply a batch (:meth:`envelopes` gives the rest on demand). On the hot path they are
        the driver's own (:mod:`messaging.store._fastpath`): no object per message beside.
        ``hashes`` False: without their partition hash (one column less per row);
        ``sources`` True: with the partition hash and the source (parked sources).

        The rows are first read without the ``types`` filter: when every one is of those
        types, they are exactly the rows the filter selects (the first ``limit`` of them),
        and the filter cost nothing per row. Otherwise they are read again with the filter,
        which these topics and types keep from then on (a consumer of some of a topic's
        types pays one wasted read)."""
        handled: frozenset[str] | None = None
        if types is not None:
            wanted = (tuple(topics), tuple(types))
            handled = self._handled.get(wanted)
            if handled is None and wanted not in self._handled:  # not tried yet
                if len(self._handled) >= _QUERY_CACHE_SIZE:
                    self._handled.clear()
                handled = self._handled[wanted] = frozenset(types)
        columns = (
            self.sourced_columns
            if sources
            else self._hashed_columns
            if hashes
            else self._batch_columns
        )
        query = self._query(
            columns,
            topics,
            after,
            partitions,
            partition_count,
            types if handled is None else None,
            limit,
        )
        if query is None:
            return []
        direct = _fastpath.sends_directly(conn)
        rows = _fastpath.fetch(conn, *query, direct=direct)
        if handled is not None and not handled.issuperset(map(_type_of, rows)):
            self._handled[wanted] = None
            query = self._query(columns, topics, after, partitions, partition_count, types, limit)
            assert query is not None
            rows = _fastpath.fetch(conn, *query, direct=direct)
        if rows and type(rows[0]) is not tuple:  # SQLAlchemy's rows, the first time
            return [tuple(row) for row in rows]
        return rows if type(rows) is list else list(rows)

    def envelopes(self, conn: Connection, positions: Sequence[int]) -> dict[int, Envelope]:
        """The envelopes of the messages at ``positions``, by position (one query)."""
        m = self._messages
        rows = conn.execute(
            select(*self._full_columns[:-1]).where(
                m.c.tenant == self.db.tenant, m.c.position.in_(positions)
            )
        )
        return {row[0]: Envelope(*row) for row in rows}

    def _query(
        self,
        columns: tuple[Any, ...],
        topics: Sequence[str],
        after: int,
        partitions: Mapping[int, int] | None,
        partition_count: int,
        types: Sequence[str] | None,
        limit: int,
    ) -> tuple[Select[Any], dict[str, int]] | None:
        """The cached query of a read and its parameters; None when nothing can match."""
        if partitions is not None and not partitions:
            return None
        # Positions and checkpoints are bound parameters, so a statement depends only on
        # the request's shape: it is built (and SQLAlchemy computes its cache key) once
        # per shape, not once per batch.
        values: dict[str, int] = {"after": after}
        groups: tuple[tuple[int, ...], ...] = ()
        if partitions is not None:
            by_checkpoint: dict[int, list[int]] = {}
            for partition, checkpoint in partitions.items():
                by_checkpoint.setdefault(checkpoint, []).append(partition)
            ordered = sorted(by_checkpoint.items())
            groups = tuple(tuple(sorted(members)) for _, members in ordered)
            values["after"] = max(after, ordered[0][0])
            if len(ordered) > 1:
                values.update((f"checkpoint_{i}", c) for i, (c, _) in enumerate(ordered))
        key = (
            columns,
            self.db.tenant,
            tuple(topics),
            None if types is None else tuple(types),
            limit,
            partition_count,
            groups,
        )
        query = self._queries.get(key)
        if query is None:
            query = self._build_query(columns, topics, types, limit, partition_count, groups)
            if len(self._queries) >= _QUERY_CACHE_SIZE:
                self._queries.clear()
            self._queries[key] = query
        return query, values

    def _build_query(
        self,
        columns: tuple[Any, ...],
        topics: Sequence[str],
        types: Sequence[str] | None,
        limit: int,
        partition_count: int,
        groups: tuple[tuple[int, ...], ...],
    ) -> Select[Any]:
        # IN lists of literal binds: expanding ones would be re-rendered on every execution.
        m = self._messages
        where: list[ColumnElement[bool]] = [
            m.c.tenant == self.db.tenant,
            m.c.topic.in_([literal(topic) for topic in topics]),
            m.c.position > bindparam("after"),
        ]
        if types is not None:
            where.append(m.c.type.in_([literal(name) for name in types]))
        bucket = m.c.partition_hash % partition_count
        if len(groups) > 1:
            where.append(
                or_(
                    *(
                        and_(
                            bucket.in_([literal(p) for p in members]),
                            m.c.position > bindparam(f"checkpoint_{i}"),
                        )
                        for i, members in enumerate(groups)
                    )
                )
            )
        elif groups and len(groups[0]) != partition_count:  # all partitions need no filter
            where.append(bucket.in_([literal(p) for p in groups[0]]))
        query = select(*columns).where(*where).order_by(m.c.position).limit(limit)
        # MariaDB may walk a topic's index by its (tenant, topic) prefix alone, from the
        # topic's first message however far the checkpoint is (benchmarks/reads.py): name
        # an index whose range starts at the checkpoint in position order (several
        # topics: the primary key, tenant and position).
        hint = f"FORCE INDEX ({self._topic_index if len(topics) == 1 else 'PRIMARY'})"
        return query.with_hint(m, hint, "mysql").with_hint(m, hint, "mariadb")

    def first_after(
        self,
        conn: Connection,
        topics: Sequence[str],
        *,
        partitions: Mapping[int, int],
        partition_count: int,
        types: Sequence[str] | None = None,
    ) -> tuple[int, float] | None:
        """The position and recorded time of the first message of ``topics`` (of ``types``)
        after the checkpoint of its partition in ``partitions``, if there is one: the
        first message of those partitions a consumer has not applied. Times are taken
        under the lock that orders positions, so every later message was recorded at
        that time or after it."""
        m = self._messages
        columns = (m.c.position, m.c.recorded_at)
        query = self._query(columns, topics, 0, partitions, partition_count, types, 1)
        row = None if query is None else conn.execute(*query).first()
        return None if row is None else (int(row[0]), float(row[1]))

    def settled_time(self, conn: Connection) -> float:
        """The database's time once no append of this tenant is in flight: a locking read
        of the tenant's position counter waits for the append holding it, so every message
        recorded before the time returned has committed, and a transaction begun after
        this one ends sees it. Run it in a transaction of its own, ended at once: the
        counter's shared lock, held until then, keeps appends waiting (MySQL; on SQLite a
        write transaction holds the only write lock, so its own clock is such a time)."""
        params = {"t": self.db.tenant, **now_params(self.db.clock)}
        return float(conn.execute(self._settled, params).scalar_one())

    def head(self, conn: Connection) -> int:
        """The highest position committed for this tenant (0 when empty)."""
        params = {"t": self.db.tenant}
        rows = _fastpath.fetch(conn, self._head, params, direct=_fastpath.sends_directly(conn))
        return int(rows[0][0] or 0) if rows else 0
