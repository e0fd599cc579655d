"""Statements sent straight to the driver behave as SQLAlchemy sends them, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from messaging import Database
from messaging.store import _fastpath


@pytest.fixture
def items(db: Database) -> Iterator[Table]:
    """A small table named with the test's prefix."""
    table = Table(
        f"{db.schema.prefix}statement_items",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("name", String(50), nullable=False),
        Column("seen", DateTime, nullable=True),
    )
    with db.transaction() as conn:
        table.create(conn)
    yield table
    with db.transaction() as conn:
        table.drop(conn)


class _Counter:
    """Counts the statements that go through ``Connection.execute``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = Connection.execute

        def counting(conn: Connection, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(conn, *args, **kwargs)

        monkeypatch.setattr(Connection, "execute", counting)


def _write(conn: Connection, statement: Any, params: list[dict[str, Any]]) -> int:
    return _fastpath.execute(conn, statement, params, direct=_fastpath.sends_directly(conn))


def _fetch(conn: Connection, statement: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = _fastpath.fetch(conn, statement, params, direct=_fastpath.sends_directly(conn))
    return [tuple(row) for row in rows]


def test_once_learned_a_write_skips_sqlalchemy_with_the_same_effect(
    db: Database, items: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run goes through SQLAlchemy; later ones write the same rows without it."""
    add = insert(items).values(id=bindparam("key"), name=bindparam("label"))
    counter = _Counter(monkeypatch)
    with db.transaction() as conn:
        assert _write(conn, add, [{"key": 1, "label": "a"}, {"key": 2, "label": "b"}]) == 2
        assert counter.calls == 1
        assert _write(conn, add, [{"key": 3, "label": "c"}, {"key": 4, "label": "d"}]) == 2
        assert _write(conn, add, [{"key": 5, "label": "e"}]) == 1  # one set: learned anew
        assert _write(conn, add, [{"key": 6, "label": "f"}]) == 1
        assert counter.calls == 2
    with db.read() as conn:
        rows = conn.execute(select(items.c.id, items.c.name).order_by(items.c.id)).all()
    assert [tuple(r) for r in rows] == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (6, "f")]


def test_rows_given_as_tuples_reach_the_driver_as_they_are_once_learned(
    db: Database, items: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """execute_rows learns through SQLAlchemy once, then hands tuples in the plan's order to
    the driver; tuples in another order, or for a statement whose values SQLAlchemy converts
    (a DateTime on SQLite), go as the mappings they stand for: the same rows either way."""
    add = insert(items)
    counter = _Counter(monkeypatch)
    seen = datetime(2024, 5, 6, 7, 8, 9)
    mapped: list[int] = []  # parameter sets the plans built from mappings
    as_mappings = _fastpath._Plan.rows

    def counted(plan: Any, params: Any) -> Any:
        mapped.append(len(params))
        return as_mappings(plan, params)

    monkeypatch.setattr(_fastpath._Plan, "rows", counted)

    def write(names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> int:
        return _fastpath.execute_rows(conn, add, names, rows, direct=_fastpath.sends_directly(conn))

    with db.transaction() as conn:
        assert write(("id", "name"), [(1, "a"), (2, "b")]) == 2
        assert counter.calls == 1
        assert write(("id", "name"), [(3, "c"), (4, "d")]) == 2
        assert mapped == []
        assert write(("name", "id"), [("e", 5), ("f", 6)]) == 2
        assert mapped == [2]
        assert write(("id", "name", "seen"), [(7, "g", seen), (8, "h", seen)]) == 2
        assert write(("id", "name", "seen"), [(9, "i", seen), (10, "j", seen)]) == 2
        assert counter.calls == 2
    with db.read() as conn:
        rows = conn.execute(select(items).order_by(items.c.id)).all()
    assert [tuple(r) for r in rows] == [
        *((n, name, None) for n, name in enumerate("abcdef", start=1)),
        *((n, name, seen) for n, name in enumerate("ghij", start=7)),
    ]


def test_row_count_of_a_direct_update_is_the_rows_matched(db: Database, items: Table) -> None:
    """An update that matches a row counts it, also when it leaves the row unchanged."""
    rename = update(items).where(items.c.id == bindparam("key")).values(name=bindparam("label"))
    with db.transaction() as conn:
        conn.execute(insert(items), [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
        assert _write(conn, rename, [{"key": 1, "label": "a"}]) == 1
        assert _write(conn, rename, [{"key": 1, "label": "a"}]) == 1
        assert _write(conn, rename, [{"key": 9, "label": "z"}]) == 0
        assert _write(conn, rename, [{"key": 1, "label": "x"}, {"key": 2, "label": "y"}]) == 2
        assert _write(conn, rename, [{"key": 1, "label": "x"}, {"key": 2, "label": "y"}]) == 2


def test_driver_errors_are_raised_as_sqlalchemy_errors(db: Database, items: Table) -> None:
    """A duplicate key sent straight to the driver raises SQLAlchemy's IntegrityError."""
    add = insert(items).values(id=bindparam("key"), name=bindparam("label"))
    with db.transaction() as conn:
        _write(conn, add, [{"key": 1, "label": "a"}, {"key": 2, "label": "b"}])
    with pytest.raises(IntegrityError), db.transaction() as conn:
        _write(conn, add, [{"key": 3, "label": "c"}, {"key": 1, "label": "again"}])
    with db.read() as conn:
        assert conn.execute(select(items.c.id).order_by(items.c.id)).scalars().all() == [1, 2]


def test_error_listeners_hear_the_errors_of_statements_sent_straight_to_the_driver(
    db: Database, items: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``handle_error`` listener (a failover list's) keeps statements on the fast path
    and hears each driver error as it would through ``Connection.execute``: one for the
    duplicate key, with the error SQLAlchemy raises."""
    add = insert(items).values(id=bindparam("key"), name=bindparam("label"))
    heard: list[tuple[type, type]] = []

    def listener(context: Any) -> None:
        heard.append((type(context.original_exception), type(context.sqlalchemy_exception)))

    event.listen(db.engine, "handle_error", listener)
    try:
        with db.transaction() as conn:
            _write(conn, add, [{"key": 1, "label": "a"}])  # learnt
        counter = _Counter(monkeypatch)
        with pytest.raises(IntegrityError), db.transaction() as conn:
            assert _fastpath.sends_directly(conn)
            _write(conn, add, [{"key": 1, "label": "again"}])
        assert counter.calls == 0  # straight to the driver
    finally:
        event.remove(db.engine, "handle_error", listener)
    assert len(heard) == 1
    driver_error, raised = heard[0]
    assert issubclass(driver_error, db.engine.dialect.loaded_dbapi.IntegrityError)
    assert raised is IntegrityError


@pytest.mark.parametrize(
    "name", ["before_execute", "after_execute", "before_cursor_execute", "after_cursor_execute"]
)
def test_execute_events_see_every_statement(db: Database, items: Table, name: str) -> None:
    """While an execute or cursor-execute listener is registered, every statement reaches it."""
    add = insert(items).values(id=bindparam("key"), name=bindparam("label"))
    query = select(items.c.id).where(items.c.id > bindparam("after"))
    seen: list[object] = []

    def listener(*args: Any) -> None:
        seen.append(args[1])

    with db.transaction() as conn:
        _write(conn, add, [{"key": 1, "label": "a"}])
        _fetch(conn, query, {"after": 0})
        event.listen(db.engine, name, listener)
        try:
            _write(conn, add, [{"key": 2, "label": "b"}])
            _fetch(conn, query, {"after": 0})
        finally:
            event.remove(db.engine, name, listener)
    assert len(seen) == 2


def test_query_rows_equal_what_sqlalchemy_returns(db: Database, items: Table) -> None:
    """A learned query returns the same rows, in order, as ``Connection.execute``."""
    query = select(items.c.id, items.c.name).where(items.c.id > bindparam("after"))
    query = query.order_by(items.c.id)
    with db.transaction() as conn:
        conn.execute(insert(items), [{"id": i, "name": f"n{i}"} for i in range(1, 6)])
        expected = [tuple(r) for r in conn.execute(query, {"after": 2}).all()]
        assert _fetch(conn, query, {"after": 2}) == expected
        assert _fetch(conn, query, {"after": 2}) == expected
        assert _fetch(conn, query, {"after": 4}) == [(5, "n5")]


def test_query_with_typed_results_keeps_sqlalchemys_values(db: Database, items: Table) -> None:
    """Result values SQLAlchemy converts (a DateTime on SQLite) come back converted."""
    when = datetime(2024, 5, 6, 7, 8, 9)
    query = select(items.c.seen).where(items.c.id == bindparam("key"))
    with db.transaction() as conn:
        conn.execute(insert(items), {"id": 1, "name": "a", "seen": when})
        assert _fetch(conn, query, {"key": 1}) == [(when,)]
        assert _fetch(conn, query, {"key": 1}) == [(when,)]
