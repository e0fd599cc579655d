"""What a handler receives beside its message: the envelope and the batch's transaction.

Writes given to :meth:`HandlerContext.execute` are buffered and sent when the batch
commits, consecutive uses of one statement grouped into a single ``executemany``: the
read-model writes of a batch cost a few round trips, not one per message. Reading
:attr:`HandlerContext.connection` sends the buffer first, so a handler always reads
its own writes.

:meth:`HandlerContext.upsert` inserts or changes a row by its primary key; a batch's
upserts of one row are folded into one and each table's go as one multi-row statement
(:mod:`messaging.applying._upserts`): the fast way to keep counters and totals.

Each run is sent by :func:`messaging.store._fastpath.execute`: through SQLAlchemy the first
time, then, when SQLAlchemy showed it is plain SQL, straight to the driver.

:class:`MessageContext` is what every handler may rely on; :class:`HandlerContext`
implements it, and :class:`sagas.SagaContext` extends it with the saga's own state.
"""

from __future__ import annotations

from collections.abc import Callable, KeysView, Mapping
from typing import Any, Protocol

from sqlalchemy import Connection, Table
from sqlalchemy.sql import Executable

from messaging._errors import ProjectionsError
from messaging._messages import Envelope
from messaging.applying import _upserts as upserts
from messaging.applying._apply_timeout import NO_DEADLINE
from messaging.applying._outbox import Outbox
from messaging.store import _fastpath
from messaging.store._database import reads_unlocked, take_write_lock
from messaging.store._rows import NewMessage
from messaging.store._tokens import NOT_SENT_AGAIN, Outgoing, Sent, Written


class MessageContext(Protocol):
    """What every handler receives beside its message, whatever its consumer's kind: the
    envelope, and (transactional consumers) buffered writes, sends and appends that
    commit with the batch's checkpoint, or not at all."""

    __slots__ = ()

    @property
    def envelope(self) -> Envelope:
        """The envelope of the message being handled."""
        ...

    @property
    def connection(self) -> Connection:
        """The batch's connection, with every buffered write sent."""
        ...

    def execute(self, statement: Executable, params: Mapping[str, Any] | None = None) -> None:
        """Run ``statement`` with ``params`` in the batch's transaction (buffered)."""
        ...

    def upsert(
        self,
        table: Table,
        key: Mapping[str, Any],
        *,
        set: Mapping[str, Any] | None = None,
        add: Mapping[str, Any] | None = None,
        insert: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert the row of ``table`` whose primary key is ``key``, or change it if it
        exists, in the batch's transaction (buffered, folded per row, one statement per
        batch; see :meth:`HandlerContext.upsert`)."""
        ...

    def send(
        self,
        destination: str,
        message: object,
        *,
        key: str | None = None,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Sent:
        """Send ``message`` to the route consumer of ``destination`` when the batch
        commits; return its message id (with its token once written)."""
        ...

    def append(
        self,
        topic: str,
        source: str,
        message: object,
        *,
        headers: Mapping[str, Any] | None = None,
    ) -> Written:
        """Append ``message`` of ``source`` to ``topic`` when the batch commits; return
        what carries its token once written."""
        ...


class HandlerContext(MessageContext):
    """The current message's envelope and, for transactional consumers, its transaction."""

    __slots__ = (
        "_conn",
        "_envelopes",
        "_keys",
        "_load_envelopes",
        "_outbox",
        "_outgoing",
        "_params",
        "_quiet",
        "_runs",
        "_sent",
        "_statement",
        "_upserts",
        "_wrote_at",
        "cause",
        "commit_before",
        "deadline",
        "immediate",
        "position",
    )

    def __init__(
        self,
        conn: Connection | None,
        load_envelopes: Callable[[], Mapping[int, Envelope]],
        *,
        immediate: bool = False,
        outbox: Outbox | None = None,
        quiet: Callable[[Envelope], bool] | None = None,
    ) -> None:
        """``quiet``: whether the sends and appends of handling a message are dropped (a
        version being built, for what the live version sent: :mod:`messaging.versions._gate`)."""
        self._conn = conn
        self._outbox = outbox
        self._quiet = quiet
        self._outgoing = Outgoing()
        """What :meth:`send` and :meth:`append` buffered since the last :meth:`flush`."""
        self._sent: dict[str, int] = {}
        self.cause: str | None = None
        """What the messages sent now are caused by, for their ids; None: the current position."""
        self._runs: list[tuple[Executable, list[Mapping[str, Any]]] | upserts.Writes] = []
        self._statement: Executable | None = None
        self._params: list[Mapping[str, Any]] = []
        self._keys: KeysView[str] | None = None
        self._upserts: upserts.Folded | None = None
        self.immediate = immediate
        """Send every write at once (used to find which message a failing batch broke on)."""
        self.deadline = NO_DEADLINE
        """When the batch must have been applied (``apply-timeout``), checked per message."""
        self.position = 0
        """The position of the message being handled."""
        self._wrote_at = -1
        """The position of the message whose handler buffered the last write."""
        self.commit_before: Callable[[int], None] | None = None
        """On SQLite, for a projection's batch: commits what the messages before the one at
        the position given wrote, the batch going on in a new transaction. Called when a
        handler reads :attr:`connection` while only earlier messages' writes are buffered,
        so that its read sees them without the write lock held for the rest of the batch."""
        self._load_envelopes = load_envelopes
        self._envelopes: Mapping[int, Envelope] | None = None

    @property
    def envelope(self) -> Envelope:
        """The current message's envelope. Loaded for the whole batch, in one query, the first
        time a handler asks: batches whose handlers never ask do not pay for it."""
        return self.envelopes[self.position]

    @property
    def envelopes(self) -> Mapping[int, Envelope]:
        """The envelopes of the whole batch, by position (loaded once, in one query)."""
        if self._envelopes is None:
            self._envelopes = self._load_envelopes()
        return self._envelopes

    def execute(self, statement: Executable, params: Mapping[str, Any] | None = None) -> None:
        """Run ``statement`` with ``params`` in the batch's transaction (buffered)."""
        if params is None:
            params = {}
        if self._upserts is not None:
            self._end_upserts()
        # One executemany per run of the same statement with the same parameter names: a
        # set with other names may mean other SQL (defaults, omitted columns).
        if statement is not self._statement or params.keys() != self._keys:
            if self._conn is None:
                raise ProjectionsError(
                    "this consumer is not transactional: it has no database writes"
                )
            if self._statement is not None:
                self._runs.append((self._statement, self._params))
            self._statement = statement
            self._params = []
            self._keys = params.keys()
        self._params.append(params)
        self._wrote_at = self.position
        if self.immediate:
            self._flush_writes()

    def upsert(
        self,
        table: Table,
        key: Mapping[str, Any],
        *,
        set: Mapping[str, Any] | None = None,
        add: Mapping[str, Any] | None = None,
        insert: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert the row of ``table`` whose primary key is ``key``, or change it if it
        exists: ``set`` columns take their values, ``add`` columns are incremented (a new
        row starts from the amount), ``insert`` columns are written only into a new row
        (e.g. the NOT NULL columns the other handlers of a table never set). A column is
        named once; the result is what running the upserts one by one gives.

        Buffered like :meth:`execute`: the batch's upserts of one row are folded into one
        (integer amounts; others are written one after the other) and each table's are
        sent as one multi-row statement per shape (``INSERT … ON DUPLICATE KEY UPDATE`` on
        MySQL/MariaDB, ``INSERT … ON CONFLICT DO UPDATE`` on SQLite). Writes of other
        statements before and after keep their order. Key values are compared as Python
        compares them: under a case-insensitive collation, spell a row's key one way.
        """
        pending = self._upserts
        if pending is None:
            if self._conn is None:
                raise ProjectionsError(
                    "this consumer is not transactional: it has no database writes"
                )
            if self._statement is not None:
                self._runs.append((self._statement, self._params))
                self._statement = None
                self._params = []
            pending = self._upserts = upserts.Folded()
        pending.add(table, key, set, add, insert)
        self._wrote_at = self.position
        if self.immediate:
            self._flush_writes()

    def send(
        self,
        destination: str,
        message: object,
        *,
        key: str | None = None,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Sent:
        """Send ``message`` to the route consumer of ``destination``; return its message id.

        Like every write of the batch, it is stored only if the batch commits (an
        outbox). A batch applied again after a failure sends the same ids again: the id
        is derived from this consumer, the causing message and the send's order, so an
        idempotent receiver (``@route_consumer(..., idempotent=True)``) handles it once.
        ``key`` is the partition key (by default the message id: any partition);
        ``headers`` are stored with the message (its ``message-id`` header wins). The id's
        ``.token`` is known once the batch's writes are flushed (see :meth:`append`).
        """
        outbox = self._outbox
        if outbox is None or self._conn is None:
            outbox = self._require_outbox()  # the reason
        cause = self.cause if self.cause is not None else str(self.position)
        count = self._sent[cause] = self._sent.get(cause, 0) + 1
        store, given = outbox.store, message_id
        if message_id is None:
            message_id = outbox.derived_id(cause, count)
        if self._quiet is not None and self._quiet(self.envelope):
            return Sent(message_id, Written(why=NOT_SENT_AGAIN))
        if given is None:  # derived: an id by construction, not checked again
            outgoing = store.outgoing_as(destination, message, key, message_id, headers)
        else:
            outgoing = store.outgoing(
                destination, message, key=key, message_id=message_id, headers=headers
            )
        return Sent(message_id, self._outgo(outgoing))

    def append(
        self,
        topic: str,
        source: str,
        message: object,
        *,
        headers: Mapping[str, Any] | None = None,
    ) -> Written:
        """Append ``message`` of ``source`` to ``topic`` when the batch commits (an outbox),
        with ``headers`` if given.

        The result's ``.token`` (a :class:`~messaging.ConsistencyToken`) is known once the
        batch's writes are flushed: after :meth:`flush` (a handler that stores the token
        in its read model calls it first) or the batch's end; it is valid once the batch
        commits. Asked earlier, or for a message a replay does not append again, it
        raises :class:`~messaging.TokenNotKnown`."""
        outbox = self._require_outbox()
        if self._quiet is not None and self._quiet(self.envelope):
            return Written(why=NOT_SENT_AGAIN)
        return self._outgo(outbox.event(topic, source, message, headers))

    def _outgo(self, message: NewMessage) -> Written:
        self._wrote_at = self.position
        outgoing = self._outgoing
        outgoing.messages.append(message)
        return Written(outgoing, len(outgoing.messages) - 1)

    def _require_outbox(self) -> Outbox:
        if self._outbox is None or self._conn is None:
            raise ProjectionsError("this consumer is not transactional: it cannot send messages")
        return self._outbox

    @property
    def connection(self) -> Connection:
        """The batch's connection, with every buffered write sent."""
        conn = self._conn
        if conn is None:
            raise ProjectionsError("this consumer is not transactional: it has no connection")
        commit = self.commit_before
        if (
            commit is not None
            and self._wrote_at < self.position
            and (self._buffered() or self._outgoing.messages)
            and reads_unlocked(conn)
        ):
            commit(self.position)
        self._flush_writes()
        return conn

    def flush(self) -> None:
        """Send the buffered writes in order, then append the messages sent (last, so that
        the store's position lock is held only until the commit that follows).

        Runs at the batch's end. A handler that needs the tokens of what it sent or
        appended (to store them in its read model) calls it first; the tenant's position
        lock is then held from there to the batch's commit, other appends waiting."""
        self._flush_writes()
        outgoing = self._outgoing
        if outgoing.messages:
            self._outgoing = Outgoing()
            assert self._outbox is not None and self._conn is not None
            take_write_lock(self._conn)
            store = self._outbox.store
            outgoing.written(store.db.tenant, store.append_encoded(self._conn, outgoing.messages))

    def _buffered(self) -> bool:
        return bool(self._runs) or self._statement is not None or self._upserts is not None

    def _end_upserts(self) -> None:
        pending, self._upserts = self._upserts, None
        assert pending is not None and self._conn is not None
        self._runs.extend(pending.runs(self._conn.dialect))

    def _flush_writes(self) -> None:
        if self._upserts is not None:
            self._end_upserts()
        if self._statement is not None:
            self._runs.append((self._statement, self._params))
            self._statement = None
            self._params = []
        runs, self._runs = self._runs, []
        if runs:
            assert self._conn is not None
            take_write_lock(self._conn)
            direct = _fastpath.sends_directly(self._conn)
            for run in runs:
                if len(run) == 2:
                    _fastpath.execute(self._conn, *run, direct=direct)
                else:
                    _fastpath.execute_rows(self._conn, *run, direct=direct)
