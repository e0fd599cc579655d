"""The SQLAlchemy internals the fast path (messaging.store._fastpath) reads are where it
expects them: if an upgrade moves one, these fail loudly instead of every statement
silently going the slow way (or worse)."""

from __future__ import annotations

import gc
import tomllib
import weakref
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, create_engine, insert
from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import ExecuteStyle
from sqlalchemy.sql import Executable

from messaging.store import _fastpath

COMPILED_ATTRIBUTES = (
    "_bind_processors",
    "positional",
    "positiontup",
    "bind_names",
    "insert_prefetch",
    "update_prefetch",
    "literal_execute_params",
    "post_compile_params",
    "escaped_bind_names",
    "effective_returning",
    "string",
)
CONTEXT_ATTRIBUTES = (
    "compiled",
    "compiled_parameters",
    "parameters",
    "execute_style",
    "statement",
    "cursor",
    "get_result_processor",
)


def _table() -> Table:
    return Table(
        "items",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("name", String(50)),
    )


def _items() -> tuple[Table, Engine, Executable]:
    """A table, an in-memory engine, and an insert of one row into that table."""
    table = _table()
    return (
        table,
        create_engine("sqlite://"),
        insert(table).values(id=bindparam("key"), name=bindparam("label")),
    )


def test_sqlalchemy_is_the_minor_version_pinned_in_pyproject() -> None:
    """The pin names one minor version, the one installed (and tested here)."""
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    pins = [d for d in project["project"]["dependencies"] if d.startswith("sqlalchemy")]
    major, minor = (int(n) for n in sqlalchemy.__version__.split(".")[:2])
    assert pins == [f"sqlalchemy>={major}.{minor},<{major}.{minor + 1}"]


def test_the_private_attributes_read_by_the_fast_path_exist() -> None:
    table, engine, statement = _items()
    with engine.begin() as conn:
        table.create(conn)
        result = conn.execute(statement, [{"key": 1, "label": "a"}, {"key": 2, "label": "b"}])
        context = result.context
        missing = [a for a in CONTEXT_ATTRIBUTES if not hasattr(context, a)]
        missing += [a for a in COMPILED_ATTRIBUTES if not hasattr(context.compiled, a)]
        assert missing == []
        compiled: Any = context.compiled  # an SQLCompiler: its private cache is not typed
        assert isinstance(compiled._bind_processors, dict)
        assert context.execute_style is ExecuteStyle.EXECUTEMANY
        # a driver error is raised through the connection's own error handling
        assert callable(getattr(conn, "_handle_dbapi_exception", None))


def test_a_plain_statement_is_learned_and_then_sent_directly() -> None:
    table, engine, statement = _items()
    with engine.begin() as conn:
        table.create(conn)
        assert _fastpath.sends_directly(conn)
        _fastpath.execute(conn, statement, [{"key": 1, "label": "a"}], direct=True)
        key, plan = _fastpath._lookup(conn, statement, {"key": 2, "label": "b"}, False)
        assert key is None  # learned
        assert plan is not None, "SQLAlchemy's execution context no longer yields a plan"
        assert _fastpath.execute(conn, statement, [{"key": 2, "label": "b"}], direct=True) == 1
        assert conn.exec_driver_sql("SELECT count(*) FROM items").scalar() == 2


def test_a_cached_plan_keeps_its_statement_alive_so_its_id_is_never_reused() -> None:
    table, engine, statement = _items()
    alive = weakref.ref(statement)
    with engine.begin() as conn:
        table.create(conn)
        _fastpath.execute(conn, statement, [{"key": 1, "label": "a"}], direct=True)
    del statement
    gc.collect()
    assert alive() is not None  # held by its plan: no other statement can take its id


def test_plans_go_with_their_engine() -> None:
    """A disposed engine's plans do not keep its statements (and their tables) alive."""
    table, engine, statement = _items()
    with engine.begin() as conn:
        table.create(conn)
        _fastpath.execute(conn, statement, [{"key": 1, "label": "a"}], direct=True)
        assert _fastpath._lookup(conn, statement, {"key": 2, "label": "b"}, False)[0] is None
    alive, gone = weakref.ref(statement), weakref.ref(table)
    engine.dispose()
    del engine, conn, statement, table
    gc.collect()
    assert alive() is None and gone() is None
