"""HandlerContext buffers writes and sends them in order, grouped only when that is safe."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select

from messaging import Database, HandlerContext

metadata = MetaData()
items = Table(
    "context_items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("name", String(50), nullable=True),
    Column("size", Integer, nullable=False, default=7),
)
ADD = insert(items)


def _no_envelopes() -> dict[int, object]:
    raise AssertionError("no handler here asks for an envelope")


def test_sets_with_different_names_are_not_merged_into_one_executemany(db: Database) -> None:
    """A later parameter set that names more columns writes them, as sent one by one."""
    with db.transaction() as conn:
        metadata.create_all(conn)
    try:
        with db.transaction() as conn:
            ctx = HandlerContext(conn, _no_envelopes)  # type: ignore[arg-type]
            ctx.execute(ADD, {"id": 1, "name": "a"})
            ctx.execute(ADD, {"id": 2, "name": "b", "size": 3})
            ctx.execute(ADD, {"id": 3, "name": "c", "size": 4})
            ctx.execute(ADD, {"id": 4, "name": "d"})
            ctx.flush()
        with db.read() as conn:
            rows = conn.execute(select(items).order_by(items.c.id)).all()
        assert [tuple(r) for r in rows] == [(1, "a", 7), (2, "b", 3), (3, "c", 4), (4, "d", 7)]
    finally:
        with db.transaction() as conn:
            metadata.drop_all(conn)


def test_reads_through_the_connection_see_buffered_writes(db: Database) -> None:
    """Asking for the connection sends the buffer first."""
    with db.transaction() as conn:
        metadata.create_all(conn)
    try:
        with db.transaction() as conn:
            ctx = HandlerContext(conn, _no_envelopes)  # type: ignore[arg-type]
            ctx.execute(ADD, {"id": 1, "name": "a"})
            count = ctx.connection.execute(select(items.c.id)).all()
            assert len(count) == 1
    finally:
        with db.transaction() as conn:
            metadata.drop_all(conn)
