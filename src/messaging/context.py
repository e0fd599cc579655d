"""What a handler receives beside its message: the envelope and the batch's transaction.

Writes given to :meth:`HandlerContext.execute` are buffered and sent when the batch
commits, consecutive uses of one statement grouped into a single ``executemany``: the
read-model writes of a batch cost a few round trips, not one per message. Reading
:attr:`HandlerContext.connection` sends the buffer first, so a handler always reads
its own writes.

The first time a statement is sent with a given set of parameter names, it goes
through SQLAlchemy as usual; when SQLAlchemy turned it into plain SQL with parameters
(no Python-side defaults, RETURNING, expanding or escaped parameters), the SQL and the
way it laid out the parameters are kept, checked against what SQLAlchemy actually sent,
and later sends of the same statement with the same parameter names skip SQLAlchemy's
per-row parameter processing (still through ``Connection.exec_driver_sql``, so events,
logging and error wrapping apply). Anything unusual goes through SQLAlchemy again.
"""

from __future__ import annotations

from collections.abc import Callable, KeysView, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import ExecuteStyle
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from messaging.errors import ProjectionsError
from messaging.messages import Envelope
from messaging.outbox import Outbox
from messaging.store import NewMessage


class HandlerContext:
    """The current message's envelope and, for transactional consumers, its transaction."""

    __slots__ = (
        "_conn",
        "_envelopes",
        "_keys",
        "_load_envelopes",
        "_outbox",
        "_outgoing",
        "_params",
        "_runs",
        "_sent",
        "_statement",
        "cause",
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
    ) -> None:
        self._conn = conn
        self._outbox = outbox
        self._outgoing: list[NewMessage] = []
        self._sent: dict[str, int] = {}
        self.cause: str | None = None
        """What the messages sent now are caused by, for their ids; None: the current position."""
        self._runs: list[tuple[Executable, list[Mapping[str, Any]]]] = []
        self._statement: Executable | None = None
        self._params: list[Mapping[str, Any]] = []
        self._keys: KeysView[str] | None = None
        self.immediate = immediate
        """Send every write at once (used to find which message a failing batch broke on)."""
        self.position = 0
        """The position of the message being handled."""
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
        if self.immediate:
            self._flush_writes()

    def send(
        self,
        destination: str,
        message: object,
        *,
        key: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """Send ``message`` to the route consumer of ``destination``; return its message id.

        Like every write of the batch, it is stored only if the batch commits (an
        outbox). A batch applied again after a failure sends the same ids again: the id
        is derived from this consumer, the causing message and the send's order, so an
        idempotent receiver (``@route_consumer(..., idempotent=True)``) handles it once.
        ``key`` is the partition key (by default the message id: any partition).
        """
        outbox = self._require_outbox()
        cause = self.cause if self.cause is not None else str(self.position)
        count = self._sent[cause] = self._sent.get(cause, 0) + 1
        if message_id is None:
            message_id = outbox.derived_id(cause, count)
        self._outgoing.append(outbox.outgoing(destination, message, key=key, message_id=message_id))
        return message_id

    def append(self, topic: str, source: str, message: object) -> None:
        """Append ``message`` of ``source`` to ``topic`` when the batch commits (an outbox)."""
        self._outgoing.append(self._require_outbox().event(topic, source, message))

    def _require_outbox(self) -> Outbox:
        if self._outbox is None or self._conn is None:
            raise ProjectionsError("this consumer is not transactional: it cannot send messages")
        return self._outbox

    @property
    def connection(self) -> Connection:
        """The batch's connection, with every buffered write sent."""
        if self._conn is None:
            raise ProjectionsError("this consumer is not transactional: it has no connection")
        self._flush_writes()
        return self._conn

    def flush(self) -> None:
        """Send the buffered writes in order, then append the messages sent (last, so that
        the store's position lock is held only until the commit that follows)."""
        self._flush_writes()
        if self._outgoing:
            outgoing, self._outgoing = self._outgoing, []
            assert self._outbox is not None and self._conn is not None
            self._outbox.store.append_encoded(self._conn, outgoing)

    def _flush_writes(self) -> None:
        if self._statement is not None:
            self._runs.append((self._statement, self._params))
            self._statement = None
            self._params = []
        runs, self._runs = self._runs, []
        assert self._conn is not None or not runs
        for statement, params in runs:
            _send(self._conn, statement, params)  # type: ignore[arg-type]


class _Plan:
    """How SQLAlchemy sends one statement: its final SQL and each parameter set's tuple."""

    __slots__ = ("names", "row", "sql")

    def __init__(self, sql: str, names: int, row: Callable[[Mapping[str, Any]], Any]) -> None:
        self.sql = sql
        self.names = names
        self.row = row


_PlanKey = tuple[int, Any, frozenset[str], bool]
_PLANS: dict[_PlanKey, tuple[Executable, _Plan | None]] = {}
_MAX_PLANS = 512


def _send(conn: Connection, statement: Executable, params: list[Mapping[str, Any]]) -> None:
    """Execute ``statement`` once per parameter set, as ``conn.execute`` would."""
    many = len(params) > 1
    key = (id(statement), conn.dialect, frozenset(params[0]), many)
    entry = _PLANS.get(key)
    if entry is not None and entry[0] is statement:
        plan = entry[1]
        if plan is not None and "schema_translate_map" not in conn.get_execution_options():
            try:
                rows = list(map(plan.row, params))
            except Exception:  # a missing name, a value a type refuses: SQLAlchemy's to report
                rows = None
            # Every name of the first set is used, so equal sizes mean equal name sets.
            if rows is not None and sum(map(len, params)) == plan.names * len(params):
                conn.exec_driver_sql(plan.sql, rows if many else rows[0])
                return
    result = conn.execute(statement, params if many else params[0])
    if entry is None:
        try:
            plan = _plan(result.context, params)
        except Exception:  # only ever a missed shortcut: the writes are already sent
            plan = None
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = (statement, plan)


def _plan(context: Any, params: Sequence[Mapping[str, Any]]) -> _Plan | None:
    """The plan of what SQLAlchemy just sent, or None unless it is plain SQL with parameters."""
    compiled = getattr(context, "compiled", None)
    processors = getattr(compiled, "_bind_processors", None)
    many = len(params) > 1
    if (
        not isinstance(compiled, SQLCompiler)
        or processors is None
        or (compiled.positional and compiled.positiontup is None)
        or context.execute_style is not (ExecuteStyle.EXECUTEMANY if many else ExecuteStyle.EXECUTE)
        or context.statement != compiled.string
        or compiled.insert_prefetch
        or compiled.update_prefetch
        or compiled.literal_execute_params
        or compiled.post_compile_params
        or compiled.escaped_bind_names
        or compiled.effective_returning
    ):
        return None
    binds: dict[str, Any] = {}
    for parameter, name in compiled.bind_names.items():
        if parameter.callable is not None or (name in binds and binds[name].key != parameter.key):
            return None
        binds[name] = parameter
    names = set(params[0])
    used: set[str] = set()
    first = context.compiled_parameters[0]
    sources: list[Any] = []
    converters: list[Callable[[Any], Any] | None] = []
    constants: dict[Any, Any] = {}
    order = list(compiled.positiontup or ()) if compiled.positional else list(binds)
    if not order:
        return None  # nothing per row to save
    for name in order:
        bind = binds.get(name)
        if bind is None:
            return None
        if bind.key in names:
            sources.append(bind.key)
        elif name in names:
            sources.append(name)
        else:
            slot = _Constant(len(sources))
            constants[slot] = first[name]
            sources.append(slot)
        used.add(sources[-1])
        converters.append(processors.get(name))
    if not names <= used:
        return None  # an unused name could change what a later set means; let SQLAlchemy decide
    row = _row_builder(sources, constants, converters)
    if compiled.positional:
        sent = [tuple(p) for p in context.parameters]
    else:
        values = row

        def row(p: Mapping[str, Any]) -> Any:
            return dict(zip(order, values(p), strict=True))

        sent = list(context.parameters)
    try:
        if [row(p) for p in params] != sent:
            return None
    except Exception:
        return None
    return _Plan(context.statement, len(names), row)


class _Constant:
    """A parameter the statement itself supplies, as a key no parameter set can contain."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _row_builder(
    sources: list[Any],
    constants: dict[Any, Any],
    converters: list[Callable[[Any], Any] | None],
) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A generated function from one parameter set to the tuple SQLAlchemy would send."""
    namespace: dict[str, Any] = {}
    items = []
    for index, (source, convert) in enumerate(zip(sources, converters, strict=True)):
        if isinstance(source, _Constant):
            namespace[f"c{index}"] = constants[source]
            value = f"c{index}"
        else:
            value = f"p[{source!r}]"
        if convert is not None:
            namespace[f"f{index}"] = convert
            value = f"f{index}({value})"
        items.append(value)
    source_code = f"def row(p):\n    return ({', '.join(items)},)\n"
    exec(compile(source_code, "<statement parameters>", "exec"), namespace)
    row: Callable[[Mapping[str, Any]], tuple[Any, ...]] = namespace["row"]
    return row
