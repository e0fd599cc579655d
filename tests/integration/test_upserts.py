"""ctx.upsert on both backends: folded within a batch exactly as if applied one by one, in
order with the other writes, under a tenant, and with a failing row halting at its message."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from clusters import consumer_worker
from effort import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from poison_item import Item
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    false,
    select,
    update,
)

from messaging import Database, HandlerContext, MessageStore, ProjectionsError, handler
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from projections import projection


def _tables(prefix: str) -> tuple[Table, Table]:
    """Two tables of the same shape: one written batched, one one upsert at a time."""
    metadata = MetaData()
    return tuple(  # type: ignore[return-value]
        Table(
            f"{prefix}upsert_{name}",
            metadata,
            Column("k", Integer, primary_key=True, autoincrement=False),
            Column("n", BigInteger, nullable=True),
            Column("m", BigInteger, nullable=True),
            Column("label", String(20), nullable=True),
        )
        for name in ("batched", "single")
    )


@pytest.fixture
def tables(db: Database) -> Iterator[tuple[Table, Table]]:
    pair = _tables(db.schema.prefix)
    with db.transaction() as conn:
        for table in pair:
            table.create(conn)
    yield pair
    with db.transaction() as conn:
        for table in pair:
            table.drop(conn)


def _no_envelopes() -> dict[int, Any]:
    raise AssertionError("no envelope asked for here")


Op = tuple[str, int, dict[str, Any]]
"""("set" | "add" | "insert-add" | "double", key, columns) of one write."""

_numbers = st.one_of(st.integers(-5, 5), st.none(), st.sampled_from([0.5, 2.5]))
_sets = st.builds(
    lambda numbers, label: {**numbers, **label},
    st.dictionaries(st.sampled_from(["n", "m"]), _numbers, min_size=1),
    st.one_of(st.just({}), st.fixed_dictionaries({"label": st.sampled_from([None, "x"])})),
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(1, 3), _sets),
        st.tuples(
            st.just("add"),
            st.integers(1, 3),
            st.dictionaries(
                st.sampled_from(["n", "m"]),
                st.one_of(st.integers(-5, 5), st.just(0.5)),
                min_size=1,
            ),
        ),
        st.tuples(
            st.just("insert-add"),
            st.integers(1, 3),
            st.fixed_dictionaries({"n": st.integers(-3, 3), "m": st.sampled_from([0, 0, 7])}),
        ),
        st.tuples(st.just("double"), st.integers(1, 3), st.just({})),
    ),
    max_size=12,
)


def _apply(ctx: HandlerContext, table: Table, ops: Sequence[Op]) -> None:
    double = (
        update(table).where(table.c.k == bindparam("key")).values(n=table.c.n * 2, m=table.c.m + 1)
    )
    for kind, key, columns in ops:
        label = {"label": "s" if columns.get("label") is None else str(columns["label"])}
        if kind == "set":
            ctx.upsert(
                table, {"k": key}, set={**columns, **label} if "label" in columns else columns
            )
        elif kind == "add":
            ctx.upsert(table, {"k": key}, add=columns, insert={"label": "new"})
        elif kind == "insert-add":
            ctx.upsert(table, {"k": key}, add={"n": columns["n"]}, insert={"m": columns["m"]})
        else:
            ctx.execute(double, {"key": key})


def _contents(conn: Any, table: Table) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in conn.execute(select(table).order_by(table.c.k))]


def test_folded_upserts_equal_the_same_upserts_applied_one_by_one(
    db: Database, tables: tuple[Table, Table]
) -> None:
    """Any sequence of sets, adds, new-row values (integers, None, non-integers that must not
    be folded) and plain statements in between, on rows that exist or not, gives the same
    rows batched (folded, one statement per shape) as sent one at a time in order."""
    batched, single = tables

    @settings(
        max_examples=examples(40 if db.is_sqlite else 25),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(ops=_ops, existing=st.sets(st.integers(1, 3)))
    def check(ops: list[Op], existing: set[int]) -> None:
        with db.transaction() as conn:
            for table in tables:
                conn.execute(table.delete())
                for key in sorted(existing):
                    conn.execute(table.insert(), {"k": key, "n": key, "m": 0, "label": "old"})
        with db.transaction() as conn:
            ctx = HandlerContext(conn, _no_envelopes)
            _apply(ctx, batched, ops)
            ctx.flush()
            _apply(HandlerContext(conn, _no_envelopes, immediate=True), single, ops)
        with db.read() as conn:
            assert _contents(conn, batched) == _contents(conn, single), ops

    check()


def test_upserts_keep_their_order_with_other_writes_and_reads_see_them(
    db: Database, tables: tuple[Table, Table]
) -> None:
    """A plain statement between upserts of one row runs between them; a read through the
    connection sees every upsert before it."""
    table = tables[0]
    with db.transaction() as conn:
        ctx = HandlerContext(conn, _no_envelopes)
        ctx.upsert(table, {"k": 1}, set={"n": 5})
        ctx.execute(update(table).where(table.c.k == 1).values(n=table.c.n * 10))
        ctx.upsert(table, {"k": 1}, add={"n": 1})
        seen = ctx.connection.execute(select(table.c.n)).scalar_one()
        ctx.upsert(table, {"k": 1}, add={"n": 1})
        ctx.flush()
    with db.read() as conn:
        assert (seen, conn.execute(select(table.c.n)).scalar_one()) == (51, 52)


def test_a_mapping_given_to_several_upserts_is_never_changed(
    db: Database, tables: tuple[Table, Table]
) -> None:
    """A handler's ``add`` mapping is kept as it is until a fold changes its row, then
    copied: a constant passed to many upserts (the first taken as the row itself) stays
    what it was, and the rows are what applying the upserts one by one gives."""
    one = {"n": 1, "m": 2}

    def apply(ctx: HandlerContext, table: Table) -> None:
        for key in (1, 2, 1, 3, 1, 2, 4):
            ctx.upsert(table, {"k": key}, add=one, insert={"label": "new"})
        ctx.upsert(table, {"k": 3}, add=one, set={"label": "set"})
        ctx.upsert(table, {"k": 2}, add={"n": 0.5})  # not folded: a second statement
        ctx.flush()

    with db.transaction() as conn:
        apply(HandlerContext(conn, _no_envelopes), tables[0])
        apply(HandlerContext(conn, _no_envelopes, immediate=True), tables[1])
    assert one == {"n": 1, "m": 2}
    with db.read() as conn:
        batched = _contents(conn, tables[0])
        assert batched == _contents(conn, tables[1])
    assert [batched[0], batched[2], batched[3]] == [
        (1, 3, 6, "new"),
        (3, 2, 4, "set"),
        (4, 1, 2, "new"),
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda ctx, t: ctx.upsert(t, {"n": 1}, set={"m": 1}), "not the primary key"),
        (lambda ctx, t: ctx.upsert(t, {"k": 1, "n": 1}, set={"m": 1}), "not the primary key"),
        (lambda ctx, t: ctx.upsert(t, {"k": 1}, set={"k": 2}), "key column"),
        (lambda ctx, t: ctx.upsert(t, {"k": 1}, set={"n": 1}, add={"n": 1}), "both in set and add"),
        (lambda ctx, t: ctx.upsert(t, {"k": 1}, add={"nope": 1}), "no column 'nope'"),
    ],
)
def test_an_upsert_that_cannot_be_written_says_why(
    db: Database,
    tables: tuple[Table, Table],
    call: Callable[[HandlerContext, Table], None],
    error: str,
) -> None:
    with pytest.raises(ProjectionsError, match=error), db.transaction() as conn:
        ctx = HandlerContext(conn, _no_envelopes)
        ctx.upsert(tables[0], {"k": 1}, set={"n": 1})  # a row of the same key folded first
        call(ctx, tables[0])
        ctx.flush()
    no_key = Table(f"{db.schema.prefix}no_key", MetaData(), Column("n", Integer))
    with pytest.raises(ProjectionsError, match="no primary key"), db.transaction() as conn:
        ctx = HandlerContext(conn, _no_envelopes)
        ctx.upsert(no_key, {"n": 1}, set={"n": 2})
        ctx.flush()


def test_a_tenants_upserts_go_to_its_own_tables(database_url: str, table_prefix: str) -> None:
    """Upserts name the declared table; a non-default tenant's are written to its copy,
    batch after batch (the second goes straight to the driver)."""
    tenant = Database(database_url, tenant="acme", table_prefix=table_prefix)
    default = Database(database_url, table_prefix=table_prefix)
    table, _ = _tables(table_prefix)
    copy = tenant.read_model(table)
    try:
        with tenant.transaction() as conn:
            copy.create(conn)
            table.create(conn)
        for _ in range(2):
            with tenant.transaction(consumer="tenant-upserts") as conn:
                ctx = HandlerContext(conn, _no_envelopes)
                for key in (1, 2, 1):
                    ctx.upsert(table, {"k": key}, add={"n": key}, insert={"label": "acme"})
                ctx.flush()
        with tenant.read() as conn:
            assert _contents(conn, copy) == [(1, 4, None, "acme"), (2, 4, None, "acme")]
        with default.read() as conn:
            assert _contents(conn, table) == []
    finally:
        with tenant.transaction() as conn:
            copy.drop(conn, checkfirst=True)
            table.drop(conn, checkfirst=True)
        tenant.dispose()
        default.dispose()


# -- in a worker: a failing row halts at its message, a lost fence writes nothing ---------------


def _worker(db: Database) -> tuple[ConsumerWorker, Table]:
    counts = Table(
        f"{db.schema.prefix}upsert_counts",
        MetaData(),
        Column("name", String(50), primary_key=True),
        Column("total", BigInteger, nullable=False),
    )

    @projection("upsert-counts", topics="items", partitions=1, tables=[counts])
    class Counts:
        @handler
        def item(self, event: Item, ctx: HandlerContext) -> None:
            # Every row of the batch has one shape: one multi-row statement. A poison item
            # sets NULL into a NOT NULL column: its row fails in the middle of it.
            total = None if event.name.startswith("poison") else len(event.name)
            ctx.upsert(counts, {"name": event.name}, set={"total": total})

    with db.transaction() as conn:
        counts.create(conn)
        Membership(db).register(conn, InstanceInfo(id="me", name="me", host="h", pid=1))
        Ownership(db).ensure_partitions(conn, "upsert-counts", 1)
        claims = Ownership(db).claim(conn, "upsert-counts", [0], "me", Membership(db).live_ids(30))
    worker = consumer_worker(db, Counts, instance_id="me")
    worker.add_claims(claims)
    return worker, counts


def _append(db: Database, names: Sequence[str]) -> list[int]:
    with db.transaction() as conn:
        return MessageStore(db).append(conn, "items", "s", [Item(name) for name in names])


def test_a_row_failing_in_the_middle_of_a_multi_row_upsert_halts_at_its_message(
    db: Database,
) -> None:
    worker, counts = _worker(db)
    positions = _append(db, ["a", "bb", "ccc", "poison", "dddd"])
    while worker.poll():
        pass
    with db.read() as conn:
        rows = dict(conn.execute(select(counts.c.name, counts.c.total)).all())
        (part,) = Ownership(db).partitions(conn, ["upsert-counts"])
    assert rows == {"a": 1, "bb": 2, "ccc": 3}
    assert (part.status, part.halted_position, part.checkpoint) == (
        "halted",
        positions[3],
        positions[2],
    )


def test_a_lost_fence_rolls_back_every_upsert_of_the_batch(db: Database) -> None:
    worker, counts = _worker(db)
    _append(db, ["a", "bb"])
    with db.transaction() as conn:  # another instance takes the partition over
        Membership(db).register(conn, InstanceInfo(id="other", name="other", host="h", pid=2))
        (taken,) = Ownership(db).claim(
            conn, "upsert-counts", [0], "other", select(Membership(db).table.c.id).where(false())
        )
    assert worker.poll() == 0
    assert worker.claims() == {}
    with db.read() as conn:
        assert conn.execute(select(counts)).all() == []
        (part,) = Ownership(db).partitions(conn, ["upsert-counts"])
    assert (part.owner, part.epoch, part.checkpoint) == ("other", taken.epoch, 0)
