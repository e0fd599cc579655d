"""Core statements on the hot path: through SQLAlchemy the first time, then straight to the driver.

The first time a statement runs with a given set of parameter names (one parameter set,
or several), it goes through ``Connection.execute`` as usual. When SQLAlchemy turned it
into plain SQL with parameters (no Python-side defaults, RETURNING, expanding or escaped
parameters; for a query, no result-type processing), the SQL and the way SQLAlchemy laid
out the parameters are kept as a plan, checked against what SQLAlchemy actually sent.
Later runs of the same statement with the same parameter names build the driver's
parameters with a generated function and call the connection's DBAPI cursor directly:
the per-statement work of SQLAlchemy's execution machinery is skipped.
:func:`execute_rows` takes each parameter set as a tuple of values of named parameters:
when those are, in that order, what the plan sends, the tuples go to the driver as they
are (the batched upserts of :mod:`messaging.applying._upserts`).

SQLAlchemy sends the statement again whenever skipping it could be noticed: outside a
transaction, with execute or cursor-execute events listening, with SQL logging on, or
with a schema translate map (:func:`sends_directly`). A tenant's table translation
(:mod:`messaging.store._tenancy`) is the one listener that does not count: a plan is learned
from what SQLAlchemy sent, which is already the translated SQL, and plans are kept per
engine (per dialect object). Driver errors go through ``Connection.execute``'s own error
handling: the same SQLAlchemy exceptions (so ``IntegrityError`` handling and
transient-error retries see no difference), the engine's ``handle_error`` listeners told
(a failover list's: :mod:`messaging.store._nodes`), a lost connection invalidated.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, NoReturn, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import ExecuteStyle
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from messaging.store._tenancy import TRANSLATES

T = TypeVar("T")


def sends_directly(conn: Connection) -> bool:
    """Whether plans may skip SQLAlchemy on ``conn`` now: in a transaction, with no
    execute or cursor-execute events (but a tenant's translation), no SQL logging and no
    schema translate map. Error events do not count: a driver error goes through
    SQLAlchemy's own error handling, which tells them."""
    dispatch: Any = conn.dispatch
    return (
        conn.in_transaction()
        and "schema_translate_map" not in conn.get_execution_options()
        and not (
            not all(getattr(fn, TRANSLATES, False) for fn in dispatch.before_execute)
            or dispatch.after_execute
            or dispatch.before_cursor_execute
            or dispatch.after_cursor_execute
        )
        and not conn.engine.logger.isEnabledFor(logging.INFO)
    )


def padded(values: Sequence[T]) -> list[T]:
    """``values`` (not empty) padded to the next power of two by repeating the last (a
    repeated value changes no ``IN``): a few statement sizes, each learnt once, serve every
    batch size."""
    size = 1 << (len(values) - 1).bit_length()
    return [*values, *[values[-1]] * (size - len(values))]


@functools.cache
def numbered(prefixes: tuple[str, ...], count: int) -> tuple[str, ...]:
    """The parameter names ``p0, q0, ..., p1, q1, ...`` of ``prefixes`` for ``count`` rows,
    in that order (made once per shape: zipped with a batch's values to name them)."""
    return tuple(f"{prefix}{i}" for i in range(count) for prefix in prefixes)


def execute(
    conn: Connection,
    statement: Executable,
    params: Sequence[Mapping[str, Any]],
    *,
    direct: bool,
) -> int:
    """Run the write ``statement`` once per parameter set, in order, as ``conn.execute``
    would (one executemany for several sets); return the driver's row count.

    ``direct`` is :func:`sends_directly` of ``conn``, asked once for many statements.
    """
    many = len(params) > 1
    key, plan = _lookup(conn, statement, params[0], many)
    if direct and plan is not None:
        rows = plan.rows(params)
        if rows is not None:
            return _send(conn, plan.sql, rows if many else rows[0], many)
    result = conn.execute(statement, params if many else params[0])
    if key is not None:
        _learn(conn, key, statement, result.context, params)
    return result.rowcount


def execute_rows(
    conn: Connection,
    statement: Executable,
    names: tuple[str, ...],
    rows: Sequence[tuple[Any, ...]],
    *,
    direct: bool,
) -> int:
    """:func:`execute` with each parameter set given as the tuple of its values of ``names``:
    handed to the driver as they are when its plan sends exactly those values in that
    order (no constants, no conversions), else as the mappings they stand for."""
    many = len(rows) > 1
    entry = _plans(conn.dialect).get((id(statement), frozenset(names), many))
    if direct and entry is not None and entry[0] is statement:
        plan = entry[1]
        if plan is not None and plan.order == names:
            return _send(conn, plan.sql, rows if many else rows[0], many)
    return execute(
        conn, statement, [dict(zip(names, row, strict=True)) for row in rows], direct=direct
    )


def fetch(
    conn: Connection, statement: Executable, params: Mapping[str, Any], *, direct: bool
) -> Sequence[Any]:
    """The rows of the query ``statement``, as ``conn.execute(statement, params).all()``
    returns them (as plain tuples when sent directly: index them, do not name them)."""
    key, plan = _lookup(conn, statement, params, False)
    if direct and plan is not None:
        rows = plan.rows([params])
        if rows is not None:
            return _query(conn, plan.sql, rows[0])
    result = conn.execute(statement, params)
    if key is not None:
        _learn(conn, key, statement, result.context, [params], query=True)  # before fetching rows
    return result.all()


# -- plans ------------------------------------------------------------------------------


class _Plan:
    """How SQLAlchemy sends one statement: its final SQL and each parameter set's layout."""

    __slots__ = ("names", "order", "row", "sql")

    def __init__(
        self,
        sql: str,
        names: int,
        row: Callable[[Mapping[str, Any]], Any],
        order: tuple[str, ...] | None = None,
    ) -> None:
        self.sql = sql
        self.names = names
        self.row = row
        self.order = order
        """The names whose values, in this order, are the driver's parameters as they are
        (positional, no constants, no conversions); None otherwise."""

    def rows(self, params: Sequence[Mapping[str, Any]]) -> list[Any] | None:
        """The driver's parameters for ``params``, or None unless every set has exactly the
        names this plan was made for (and values its types accept)."""
        try:
            rows = list(map(self.row, params))
        except Exception:  # a missing name, a value a type refuses: SQLAlchemy's to report
            return None
        # Every name of a set is used, so equal sizes mean equal name sets.
        if sum(map(len, params)) != self.names * len(params):
            return None
        return rows


_PlanKey = tuple[int, frozenset[str], bool]
_Plans = dict[_PlanKey, tuple[Executable, "_Plan | None"]]
_PLANS_ATTRIBUTE = "_projections_fastpath_plans"
_MAX_PLANS = 512


def _plans(dialect: Any) -> _Plans:
    """The plans of one engine's dialect, by (statement id, parameter names, many).

    Kept on the dialect, so that they go with their engine: plans that outlived it would
    hold its statements, and through them its tables (a disposed ``Database`` kept
    alive). Each entry holds its statement strongly, so that statement cannot be
    collected and its id cannot be reused by another while the entry exists; a lookup
    also checks the entry's statement ``is`` the one asked about. SQLAlchemy's private
    attributes read below are pinned by the dependency on one minor version and checked
    by tests/unit/test_fastpath_internals.py."""
    plans: _Plans | None = dialect.__dict__.get(_PLANS_ATTRIBUTE)
    if plans is None:
        plans = {}
        setattr(dialect, _PLANS_ATTRIBUTE, plans)
    return plans


def _lookup(
    conn: Connection, statement: Executable, first: Mapping[str, Any], many: bool
) -> tuple[_PlanKey | None, _Plan | None]:
    """The plan of ``statement`` for these names, or the key to learn one under (if not
    tried yet)."""
    key = (id(statement), frozenset(first), many)
    entry = _plans(conn.dialect).get(key)
    if entry is None or entry[0] is not statement:
        return key, None
    return None, entry[1]


def _learn(
    conn: Connection,
    key: _PlanKey,
    statement: Executable,
    context: Any,
    params: Sequence[Mapping[str, Any]],
    *,
    query: bool = False,
) -> None:
    """Keep the plan of what SQLAlchemy just sent (None when there is none to keep)."""
    try:
        plan = _plan(context, params)
        if plan is not None and query and not _plain_results(statement, context):
            plan = None
    except Exception:  # only ever a missed shortcut: the statement has already run
        plan = None
    plans = _plans(conn.dialect)
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = (statement, plan)


def _plain_results(statement: Executable, context: Any) -> bool:
    """Whether SQLAlchemy hands the driver's result values over unchanged."""
    columns = getattr(statement, "selected_columns", None)
    description = context.cursor.description
    if columns is None or description is None or len(columns) != len(description):
        return False
    return all(
        context.get_result_processor(column.type, entry[0], entry[1]) is None
        for column, entry in zip(columns, description, strict=True)
    )


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
    plain: tuple[str, ...] | None = None
    if compiled.positional:
        sent = [tuple(p) for p in context.parameters]
        if not constants and not any(converters):
            plain = tuple(sources)
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
    return _Plan(context.statement, len(names), row, plain)


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
    """A generated function from one parameter set to the tuple SQLAlchemy would send.
    Without conversions it joins the constants with ``itemgetter`` runs of the names
    between them (a C loop, and little code to compile for a statement of a thousand
    parameters); otherwise it lists every value."""
    namespace: dict[str, Any] = {}
    parts: list[str] = []
    if not any(converters):
        run: list[str] = []
        for source in [*sources, None]:
            if isinstance(source, str):
                run.append(source)
                continue
            if len(run) == 1:  # an itemgetter of one name gives the value, not a tuple
                parts.append(f"(p[{run[0]!r}],)")
            elif run:
                namespace[f"g{len(parts)}"] = itemgetter(*run)
                parts.append(f"g{len(parts)}(p)")
            run = []
            if source is not None:
                namespace[f"c{len(parts)}"] = (constants[source],)
                parts.append(f"c{len(parts)}")
        if len(parts) == 1 and parts[0] == "g0(p)":
            getter: Callable[[Mapping[str, Any]], tuple[Any, ...]] = namespace["g0"]
            return getter
        body = " + ".join(parts)
    else:
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
        body = f"({', '.join(items)},)"
    exec(compile(f"def row(p):\n    return {body}\n", "<statement parameters>", "exec"), namespace)
    row: Callable[[Mapping[str, Any]], tuple[Any, ...]] = namespace["row"]
    return row


# -- the driver -------------------------------------------------------------------------


def _send(conn: Connection, sql: str, parameters: Any, many: bool) -> int:
    """Execute plain SQL on the connection's DBAPI cursor; return its row count."""
    cursor = conn.connection.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, parameters)
        count: int = cursor.rowcount
    except BaseException as exc:
        _raise_as_sqlalchemy(conn, exc, sql, parameters, cursor)
    cursor.close()
    return count


def _query(conn: Connection, sql: str, parameters: Any) -> Sequence[Any]:
    """Run a plain-SQL query on the connection's DBAPI cursor; return all its rows."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, parameters)
        rows: Sequence[Any] = cursor.fetchall()
    except BaseException as exc:
        _raise_as_sqlalchemy(conn, exc, sql, parameters, cursor)
    cursor.close()
    return rows


def _raise_as_sqlalchemy(
    conn: Connection, exc: BaseException, sql: str, parameters: Any, cursor: Any
) -> NoReturn:
    """Raise what ``Connection.execute`` raises for a driver error, the way it does: its
    error handling wraps the error, tells the engine's ``handle_error`` listeners (a
    failover list's among them) and invalidates the connection (and the pool's older
    ones) when the error means it is gone. An interrupt such as KeyboardInterrupt, which
    leaves the connection's state unknown, invalidates it too."""
    if not isinstance(exc, conn.dialect.loaded_dbapi.Error):
        if not isinstance(exc, Exception):
            conn.invalidate(exc)
        raise exc
    conn._handle_dbapi_exception(exc, sql, parameters, cursor, None)
