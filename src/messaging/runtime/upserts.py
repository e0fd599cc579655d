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

from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy import Table, literal_column
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable

from messaging.errors import ProjectionsError

Shape = tuple[frozenset[str], frozenset[str], frozenset[str]]
"""The columns an upserted row sets, adds to, and writes only when new (besides its key)."""

_STATEMENTS: dict[tuple[Table, str, Shape], Executable] = {}
_MAX_STATEMENTS = 256


_Row = list[Any]
"""One row's pending upsert, as a list (the hot path builds one per new row, and keeps as
few objects alive as it can: the garbage collector's passes cost in proportion to them):

- ``[0]`` values: the columns it changes, each with what a new row gets, which is also
  what an existing row is set to or (the columns in ``[1]``) incremented by: one
  statement can say no more. Its own dict, or, while it ``is`` ``[1]``, the handler's
  ``add`` (copied before the first fold changes it).
- ``[1]`` adds: the columns of ``[0]`` added to (the handler's ``add`` until a fold
  changes them).
- ``[2]`` inserts: what only a new row gets (the handler's mapping).
- ``[3]`` identity: the key's value (a tuple of them for a composite key).
- ``[4]`` generation: sent after every row of the generations before (rows of its key
  that it could not be folded into).

Like the parameters given to ``execute``, a handler's mappings must not change after the call.
"""


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
    return [values, add or (), insert or _NOTHING, identity, generation]


_NOTHING: Mapping[str, Any] = {}


def _fold_into(
    row: _Row,
    set_: Mapping[str, Any] | None,
    add: Mapping[str, Any] | None,
    primary: tuple[str, ...],
) -> bool:
    """Apply a later upsert of the same row to ``row`` (whose ``values`` are its own);
    False (nothing changed) when the result would differ from applying both in turn (or
    when :func:`_new_row` would refuse the upsert). Its ``insert`` values never matter:
    the row exists by then."""
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


class Folded:
    """A batch's upserts so far, each folded into the pending row of its key as it comes
    (in message order, with no other write between them): :meth:`add` is the hot path of
    a read model's handlers, :meth:`runs` what is sent."""

    __slots__ = ("_current", "_table", "_tables")

    def __init__(self) -> None:
        self._tables: dict[Table, _Pending] = {}
        """Per table, in the order first upserted."""
        self._table: Table | None = None
        self._current: _Pending | None = None
        """The pending rows of ``_table``, the table last upserted into."""

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
        pending = self._current
        if table is not self._table or pending is None:
            pending = self._tables.get(table)
            if pending is None:
                pending = self._tables[table] = _Pending(table)
            self._table, self._current = table, pending
        column = pending.column
        try:
            if column is not None and len(key) == 1:
                identity = key[column]
            else:
                if len(key) != len(pending.primary):
                    raise KeyError(key)
                identity = tuple([key[c] for c in pending.primary])
        except KeyError:
            raise _wrong_key(table, key, pending.primary) from None
        latest = pending.latest
        row = latest.get(identity)
        if row is None:
            if set_ is None and add is not None and add.keys().isdisjoint(key):
                # The common case, inline: a new row only added to.
                row = latest[identity] = [add, add, insert or _NOTHING, identity, 0]
                pending.rows.append(row)
                return
        else:
            values = row[0]
            if values is row[1]:  # the handler's: copied before it changes
                values = row[0] = dict(values)
            if set_ is None and add:
                # The common case, inline: integers added to integers already pending.
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
            if _fold_into(row, set_, add, pending.primary):
                return
        row = latest[identity] = _new_row(
            table, key, set_, add, insert, identity, 0 if row is None else row[4] + 1
        )
        pending.rows.append(row)

    def runs(self, dialect: Dialect) -> Iterator[tuple[Executable, list[Mapping[str, Any]]]]:
        """The statements that write the pending rows, each with its parameter sets: per
        table in the order first upserted, per generation, one statement per shape."""
        for table, pending in self._tables.items():
            # Rows are grouped by the order their columns come in first (cheap), then by shape.
            by_order: dict[tuple[int, Any, Any, Any], list[Mapping[str, Any]]] = {}
            column, primary = pending.column, pending.primary
            for values, adds, inserts, identity, generation in pending.rows:
                order = (generation, tuple(values), tuple(adds), tuple(inserts))
                params = by_order.get(order)
                if params is None:
                    params = by_order[order] = []
                key = {column: identity} if column else dict(zip(primary, identity, strict=True))
                params.append({**inserts, **values, **key})
            by_shape: dict[tuple[int, Shape], list[Mapping[str, Any]]] = {}
            for (generation, changed, added, inserted), params in by_order.items():
                adds = frozenset(added)
                shape = (frozenset(changed) - adds, adds, frozenset(inserted) - frozenset(changed))
                by_shape.setdefault((generation, shape), []).extend(params)
            for (_, shape), params in sorted(by_shape.items(), key=lambda item: item[0][0]):
                yield statement(table, dialect, shape), params


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


def statement(table: Table, dialect: Dialect, shape: Shape) -> Executable:
    """The upsert of rows of ``shape`` into ``table`` for ``dialect``, built once (so the
    driver fast path learns it once): ``ON CONFLICT`` on SQLite, ``ON DUPLICATE KEY UPDATE``
    with ``VALUES()`` on MySQL/MariaDB."""
    cache_key = (table, dialect.name, shape)
    built = _STATEMENTS.get(cache_key)
    if built is not None:
        return built
    sets, adds, inserts = shape
    missing = sorted(column for column in sets | adds | inserts if column not in table.c)
    if missing:
        raise ProjectionsError(f"upsert into {table.name!r}: no column {missing[0]!r}")
    changed = sorted((column, column in adds) for column in sets | adds)
    primary = primary_key(table)
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
    if len(_STATEMENTS) >= _MAX_STATEMENTS:
        _STATEMENTS.clear()
    _STATEMENTS[cache_key] = built
    return built
