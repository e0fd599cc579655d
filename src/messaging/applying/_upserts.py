"""Upserts handlers ask for, folded per row within a batch and sent as multi-row statements.

:meth:`messaging.HandlerContext.upsert` inserts a read-model row by its primary key or
changes the row that exists: ``set`` columns take their values, ``add`` columns are
incremented (a new row starts from the amount), ``insert`` columns are written only into
a new row. Within a batch the upserts of one row are folded into one, in message order,
whenever the folded row is exactly what applying them one by one gives (integer
amounts; a ``set`` after an ``add`` wins, an ``add`` after a ``set`` adds to its value);
otherwise the later one waits for a second statement. Every row of one shape (table and
how each column is written) goes into one statement, sent as one multi-row ``INSERT …
ON DUPLICATE KEY UPDATE col = col + VALUES(col)`` by PyMySQL (the ``VALUES()`` form is
the one it batches) and as ``INSERT … ON CONFLICT (key) DO UPDATE`` on SQLite: the
read-model writes of a batch cost one round trip per shape, not one per message.

Rows are told apart by their key values as Python compares them: under a
case-insensitive collation, spell one row's key one way. The table's other unique keys,
if any, must not be what an upsert conflicts on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sqlalchemy import Table, literal_column
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable

from messaging._errors import ProjectionsError

Shape = tuple[frozenset[str], frozenset[str], frozenset[str]]
"""The columns an upserted row sets, adds to, and writes only when new (besides its key)."""

Writes = tuple[Executable, tuple[str, ...], list[tuple[Any, ...]]]
"""A statement, the names of its parameters and each row's values of them, in that order."""


_Row = list[Any]
"""One row's pending upsert, as a list (the hot path builds one per new row, and keeps as
few objects alive as it can: the garbage collector's passes cost in proportion to them):

- ``[0]`` values: the columns it changes, each with what a new row gets, which is also
  what an existing row is set to or (the columns in ``[1]``) incremented by: one
  statement can say no more. Its own dict.
- ``[1]`` adds: the columns of ``[0]`` added to: ``[0]`` itself when all of them are (a
  row only added to), else the handler's ``add`` until a fold changes them. None: a row
  only added to whose ``[0]`` is still the handler's own ``add`` dict, taken as it is
  (not copied: most rows are never folded into) and copied before the first change.
- ``[2]`` inserts: what only a new row gets (the handler's mapping).
- ``[3]`` identity: the key's value (a tuple of them for a composite key).
- ``[4]`` generation: sent after every row of the generations before (rows of its key
  that it could not be folded into).

Like the parameters given to ``execute``, a handler's mappings must not change after the call.
"""


_Writer = tuple[
    Executable,
    tuple[str, ...],
    Callable[[list[_Row]], list[tuple[Any, ...]]],
    Callable[[list[_Row], Mapping[str, Any]], tuple[list[tuple[Any, ...]], list[_Row]]],
]
"""A shape's statement, its parameter names, rows → their parameters, and (rows, an insert
mapping) → (the parameters of those rows only added to that have the shape with that
insert mapping, in the first generation; the other rows)."""
_WRITERS: dict[tuple[Table, str, Shape], _Writer] = {}
_MAX_WRITERS = 256


def _new_row(
    table: Table,
    key: Mapping[str, Any],
    set_: Mapping[str, Any] | None,
    add: Mapping[str, Any] | None,
    insert: Mapping[str, Any] | None,
    identity: Any,
    generation: int,
) -> _Row:
    """One upsert as a row; ProjectionsError when it sets or adds to a key column, or names
    a column both in ``set`` and ``add`` (a column in either is not an ``insert`` one)."""
    values = {**set_, **add} if set_ and add else dict(set_ or add or {})
    if set_ and add and len(values) != len(set_) + len(add):
        raise ProjectionsError(f"upsert into {table.name!r}: a column both in set and add")
    if not values.keys().isdisjoint(key):
        raise ProjectionsError(f"upsert into {table.name!r}: a key column in set or add")
    adds = (add or ()) if set_ else values
    return [values, adds, insert or _NOTHING, identity, generation]


_NOTHING: Mapping[str, Any] = {}


def _fold_into(
    row: _Row,
    set_: Mapping[str, Any] | None,
    add: Mapping[str, Any] | None,
    primary: tuple[str, ...],
) -> bool:
    """Apply a later upsert of the same row to ``row``; False (nothing changed) when the
    result would differ from applying both in turn (or when :func:`_new_row` would refuse
    the upsert). Its ``insert`` values never matter: the row exists by then."""
    if row[1] is None:  # the handler's mapping: ours from now on
        row[0] = row[1] = dict(row[0])
    values: dict[str, Any] = row[0]
    if add:
        for column, amount in add.items():
            current = values.get(column)
            if type(current) is not int or type(amount) is not int:
                if current is not None or column in values:
                    return False  # not integers: added in turn, not folded
                start = row[2].get(column)
                if type(start) is not int or start != 0 or type(amount) is not int:
                    return False  # a new row would start from a default (or a key column)
        if set_ and not set_.keys().isdisjoint(add):
            return False
    if set_ and not set_.keys().isdisjoint(primary):
        return False
    adds = row[1] = set(row[1])
    if add:
        for column, amount in add.items():
            if column in values:
                values[column] += amount
            else:  # written only into a new row, as 0: now added to
                values[column] = amount
                adds.add(column)
    if set_:
        values.update(set_)
        adds.difference_update(set_)
    return True


class _Pending:
    """One table's pending rows."""

    __slots__ = ("column", "latest", "primary", "rows")

    def __init__(self, table: Table) -> None:
        self.primary = primary_key(table)
        self.column = self.primary[0] if len(self.primary) == 1 else None
        """The one primary-key column (None: a composite key)."""
        self.latest: dict[Any, _Row] = {}
        """The latest row of each key value."""
        self.rows: list[_Row] = []
        """Every row, in the order created."""

    def identity(self, key: Mapping[str, Any]) -> Any:
        """The value (a tuple of them for a composite key) ``key`` names its row by;
        KeyError unless it names exactly the primary key's columns."""
        if len(key) != len(self.primary):
            raise KeyError(key)
        return key[self.primary[0]] if self.column else tuple([key[c] for c in self.primary])


class Folded:
    """A batch's upserts so far, each folded into the pending row of its key as it comes
    (in message order, with no other write between them): :meth:`add` is the hot path of
    a read model's handlers, :meth:`runs` what is sent."""

    __slots__ = ("_current", "_table", "_tables")

    _current: _Pending
    """The pending rows of ``_table``, the table last upserted into."""

    def __init__(self) -> None:
        self._tables: dict[Table, _Pending] = {}
        """Per table, in the order first upserted."""
        self._table: Table | None = None

    def add(
        self,
        table: Table,
        key: Mapping[str, Any],
        set_: Mapping[str, Any] | None,
        add: Mapping[str, Any] | None,
        insert: Mapping[str, Any] | None,
    ) -> None:
        """Fold one upsert into the row of its key, or start a row (ProjectionsError for an
        upsert :func:`_new_row` refuses, or a ``key`` that is not the primary key)."""
        pending = self._current if table is self._table else self._switch(table)
        column = pending.column
        try:
            identity = key[column] if column and len(key) == 1 else pending.identity(key)
        except KeyError:
            raise _wrong_key(table, key, pending.primary) from None
        latest = pending.latest
        row = latest.get(identity)
        if set_ is None and add:  # the common cases, inline
            if row is None:
                if column and column not in add:  # a new row, only added to
                    if type(add) is dict:  # taken as it is until a fold changes it
                        row = [add, None, insert or _NOTHING, identity, 0]
                    else:
                        values = dict(add)
                        row = [values, values, insert or _NOTHING, identity, 0]
                    latest[identity] = row
                    pending.rows.append(row)
                    return
            else:  # integers added to integers already pending
                values = row[0]
                if row[1] is None:  # the handler's mapping: ours from now on
                    values = row[0] = row[1] = dict(values)
                for name, amount in add.items():
                    current = values.get(name)
                    if type(current) is not int or type(amount) is not int:
                        break
                    values[name] = current + amount
                else:
                    return
                for undo, amount in add.items():  # undo up to the column that is not
                    if undo == name:
                        break
                    values[undo] -= amount
        if row is not None and _fold_into(row, set_, add, pending.primary):
            return
        row = latest[identity] = _new_row(
            table, key, set_, add, insert, identity, 0 if row is None else row[4] + 1
        )
        pending.rows.append(row)

    def _switch(self, table: Table) -> _Pending:
        pending = self._tables.get(table)
        if pending is None:
            pending = self._tables[table] = _Pending(table)
        self._table, self._current = table, pending
        return pending

    def runs(self, dialect: Dialect) -> Iterator[Writes]:
        """The statements that write the pending rows, each with its parameter names and
        rows: per table in the order first upserted, per generation, one per shape."""
        for table, pending in self._tables.items():
            rows = pending.rows
            params: dict[tuple[int, Shape], list[tuple[Any, ...]]] = {}
            # The common case in one pass: the rows only added to like the first such row
            # (the same columns and insert mapping, first generation) become parameters
            # at once; only the others are grouped below.
            for row in rows:
                if (row[1] is None or row[1] is row[0]) and not row[4]:
                    only = frozenset(row[0])
                    shape = (_NONE, only, frozenset(row[2]) - only)
                    params[(0, shape)], rows = _writer(table, dialect, shape)[3](rows, row[2])
                    break
            # The others are grouped by the order their columns come in first (cheap),
            # then by shape; a row only added to, like the row before it, joins its group
            # at once.
            by_order: dict[tuple[int, Any, Any, Any], list[_Row]] = {}
            group: list[_Row] = []
            like: tuple[Any, Mapping[str, Any], int] | None = None
            for row in rows:
                values, adds, inserts, _, generation = row
                if adds is None:
                    adds = values
                if not (
                    like is not None
                    and adds is values
                    and inserts is like[1]
                    and generation == like[2]
                    and values.keys() == like[0]
                ):
                    changed = tuple(values)
                    added = changed if adds is values else tuple(adds)
                    group = by_order.setdefault((generation, changed, added, tuple(inserts)), [])
                    like = (values.keys(), inserts, generation) if adds is values else None
                group.append(row)
            for (generation, changed, added, inserted), rows in by_order.items():
                adds = frozenset(added)
                shape = (frozenset(changed) - adds, adds, frozenset(inserted) - frozenset(changed))
                values_of = _writer(table, dialect, shape)[2]
                params.setdefault((generation, shape), []).extend(values_of(rows))
            for (_, shape), values in sorted(params.items(), key=lambda item: item[0][0]):
                built, names, _, _ = _writer(table, dialect, shape)
                yield built, names, values


_NONE: frozenset[str] = frozenset()


def primary_key(table: Table) -> tuple[str, ...]:
    """The keys of ``table``'s primary-key columns; ProjectionsError if it has none."""
    names = tuple(column.key for column in table.primary_key)
    if not names:
        raise ProjectionsError(f"upsert into {table.name!r}: the table has no primary key")
    return names


def _wrong_key(table: Table, key: Mapping[str, Any], primary: tuple[str, ...]) -> Exception:
    return ProjectionsError(
        f"upsert into {table.name!r}: key names {sorted(key)}, not the primary key {list(primary)}"
    )


def _writer(table: Table, dialect: Dialect, shape: Shape) -> _Writer:
    """The upsert of rows of ``shape`` into ``table`` for ``dialect``, built once (so the
    driver fast path learns it once), its parameter names (in the table's column order)
    and generated functions from rows to their values of them (``split``: for a shape
    with no ``set`` columns, see :data:`_Writer`)."""
    cache_key = (table, dialect.name, shape)
    writer = _WRITERS.get(cache_key)
    if writer is None:
        sets, adds, inserts = shape
        primary = primary_key(table)
        wanted = sets | adds | inserts | set(primary)
        names = tuple(column.key for column in table.columns if column.key in wanted)
        sources = {c: f"v[{c!r}]" for c in sets | adds}
        sources.update({c: f"i[{c!r}]" for c in inserts})
        sources.update({c: f"k[{i}]" if len(primary) > 1 else "k" for i, c in enumerate(primary)})
        values = f"({', '.join(sources[n] for n in names)},)"
        alike = " and ".join([f"len(v) == {len(adds)}", *(f"{c!r} in v" for c in sorted(adds))])
        source = (
            "def values_of(rows):\n"
            f"    return [{values} for v, _, i, k, _ in rows]\n"
            "def split(rows, ins):\n"
            "    taken = []\n"
            "    rest = []\n"
            "    for row in rows:\n"
            "        v, a, i, k, g = row\n"
            f"        if (a is v or a is None) and i is ins and not g and {alike}:\n"
            f"            taken.append({values})\n"
            "        else:\n"
            "            rest.append(row)\n"
            "    return taken, rest\n"
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<upsert rows {table.name}>", "exec"), namespace)
        writer = (
            statement(table, dialect, shape),
            names,
            namespace["values_of"],
            namespace["split"],
        )
        if len(_WRITERS) >= _MAX_WRITERS:
            _WRITERS.clear()
        _WRITERS[cache_key] = writer
    return writer


def statement(table: Table, dialect: Dialect, shape: Shape) -> Executable:
    """The upsert of rows of ``shape`` into ``table`` for ``dialect``: ``ON CONFLICT`` on
    SQLite, ``ON DUPLICATE KEY UPDATE`` with ``VALUES()`` on MySQL/MariaDB."""
    sets, adds, inserts = shape
    missing = sorted(column for column in sets | adds | inserts if column not in table.c)
    if missing:
        raise ProjectionsError(f"upsert into {table.name!r}: no column {missing[0]!r}")
    changed = sorted((column, column in adds) for column in sets | adds)
    primary = primary_key(table)
    built: Executable
    if dialect.name == "sqlite":
        lite = sqlite.insert(table)
        excluded = lite.excluded
        updates = {c: table.c[c] + excluded[c] if added else excluded[c] for c, added in changed}
        built = (
            lite.on_conflict_do_update(index_elements=list(primary), set_=updates)
            if updates
            else lite.on_conflict_do_nothing(index_elements=list(primary))
        )
    elif dialect.name in ("mysql", "mariadb"):
        quote = dialect.identifier_preparer.quote
        inserted: dict[str, Any] = {
            c: literal_column(f"VALUES({quote(table.c[c].name)})") for c, _ in changed
        }
        updates = {c: table.c[c] + inserted[c] if added else inserted[c] for c, added in changed}
        # Nothing to change in an existing row: set a key column to itself (never IGNORE,
        # which would turn other errors into warnings).
        built = mysql.insert(table).on_duplicate_key_update(
            updates or {primary[0]: table.c[primary[0]]}
        )
    else:
        raise ProjectionsError(f"upsert is not supported on {dialect.name}")
    return built
