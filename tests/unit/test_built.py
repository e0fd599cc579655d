"""Statements built once per table live as long as their table."""

from __future__ import annotations

import gc
import weakref

from sqlalchemy import Column, Integer, MetaData, Select, Table, bindparam, select

from messaging.store._built import per_table

BUILT: list[str] = []


@per_table
def _query(t: Table, size: int) -> Select[tuple[int]]:
    BUILT.append(t.name)
    return select(t.c.id).where(t.c.id == bindparam("i")).limit(size)


def _table(name: str) -> Table:
    return Table(name, MetaData(), Column("id", Integer, primary_key=True))


def test_built_once_per_table_and_arguments() -> None:
    first, second = _table("a"), _table("b")
    assert _query(first, 1) is _query(first, 1)
    assert _query(first, 2) is not _query(first, 1)
    assert _query(second, 1) is not _query(first, 1)
    assert BUILT.count("a") == 2 and BUILT.count("b") == 1


def test_a_dropped_table_and_its_statements_go() -> None:
    table = _table("c")
    gone, statement = weakref.ref(table), weakref.ref(_query(table, 1))
    del table
    gc.collect()
    assert gone() is None and statement() is None
