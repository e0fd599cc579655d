"""The message store on SQLite and MySQL: appends, versions, positions, reads and tenants."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from effort import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messaging import Database, Envelope, MessageStore, NewMessage, VersionConflict, message
from messaging.store._clock import ManualClock
from messaging.store._migrations import migrate
from messaging.store._rows import partition_hash, partition_of


@message("test.store.created")
@attrs.define(frozen=True)
class Created:
    name: str


@message("test.store.changed")
@attrs.define(frozen=True)
class Changed:
    value: int


class Boom(Exception):
    """Raised by a test to abort a transaction."""


def _read(db: Database, topics: Sequence[str], **kwargs: Any) -> list[Any]:
    store = MessageStore(db)
    with db.read() as conn:
        return list(store.read(conn, topics, **kwargs))


def _head(db: Database) -> int:
    with db.read() as conn:
        return MessageStore(db).head(conn)


def _positions(rows: Sequence[Any]) -> list[int]:
    return [int(r[0]) for r in rows]


def test_rolled_back_append_leaves_nothing(db: Database) -> None:
    """An append whose surrounding transaction rolls back leaves no message and no position."""
    store = MessageStore(db)
    with pytest.raises(Boom), db.transaction() as conn:
        assert store.append(conn, "orders", "o-1", [Created("a"), Changed(1)]) == [1, 2]
        raise Boom
    assert _read(db, ["orders"]) == []
    assert _head(db) == 0
    with db.transaction() as conn:
        assert store.append(conn, "orders", "o-1", [Created("a")]) == [1]
    assert [(r[2], r[3]) for r in _read(db, ["orders"])] == [("o-1", 1)]


def test_append_commits_with_the_callers_transaction(db: Database) -> None:
    """Appended messages become visible to other connections only when the caller commits."""
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "orders", "o-1", [Created("a")])
        assert _read(db, ["orders"]) == []
    assert _positions(_read(db, ["orders"])) == [1]


def test_positions_are_consecutive_and_monotonic(db: Database) -> None:
    """Positions handed out by successive appends run 1, 2, 3, ... without gaps."""
    store = MessageStore(db)
    returned: list[int] = []
    sizes = [1, 3, 2, 5, 1]
    for index, size in enumerate(sizes):
        with db.transaction() as conn:
            returned += store.append(conn, "t", f"s-{index % 2}", [Changed(i) for i in range(size)])
    assert returned == list(range(1, sum(sizes) + 1))
    assert _positions(_read(db, ["t"])) == returned
    assert _head(db) == sum(sizes)


def test_versions_increase_per_topic_and_source(db: Database) -> None:
    """Each (topic, source) numbers its own messages 1, 2, 3, ... across appends."""
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "a", "x", [Created("1"), Changed(1)])
        store.append(conn, "a", "y", [Created("2")])
    with db.transaction() as conn:
        store.append(conn, "a", "x", [Changed(2)])
        store.append(conn, "b", "x", [Created("3")])
        store.append_encoded(
            conn,
            [
                NewMessage(topic="a", source="y", type="test.store.changed", payload='{"value":1}'),
                NewMessage(topic="a", source="x", type="test.store.changed", payload='{"value":3}'),
                NewMessage(topic="a", source="y", type="test.store.changed", payload='{"value":2}'),
            ],
        )
    rows = _read(db, ["a", "b"])
    versions = [(r[1], r[2], r[3]) for r in rows]
    assert versions == [
        ("a", "x", 1),
        ("a", "x", 2),
        ("a", "y", 1),
        ("a", "x", 3),
        ("b", "x", 1),
        ("a", "y", 2),
        ("a", "x", 4),
        ("a", "y", 3),
    ]


def test_expected_version_matches_current_version(db: Database) -> None:
    """An append with the right expected version succeeds (0 for a new source)."""
    store = MessageStore(db)
    with db.transaction() as conn:
        assert store.append(conn, "acc", "a-1", [Created("a")], expected_version=0) == [1]
    with db.transaction() as conn:
        assert store.append(conn, "acc", "a-1", [Changed(1), Changed(2)], expected_version=1) == [
            2,
            3,
        ]
    assert [r[3] for r in _read(db, ["acc"])] == [1, 2, 3]


@pytest.mark.parametrize(("expected", "actual"), [(1, 2), (3, 2), (0, 2)])
def test_expected_version_conflict_writes_nothing(db: Database, expected: int, actual: int) -> None:
    """A wrong expected version raises VersionConflict with expected/actual and writes nothing."""
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "acc", "a-1", [Created("a"), Changed(1)])
    head = _head(db)
    with pytest.raises(VersionConflict) as info, db.transaction() as conn:
        store.append(conn, "acc", "a-1", [Changed(2), Changed(3)], expected_version=expected)
    assert (info.value.topic, info.value.source) == ("acc", "a-1")
    assert info.value.expected == expected
    assert info.value.actual == actual
    assert f"expected version {expected}" in str(info.value)
    assert _positions(_read(db, ["acc"])) == [1, 2]
    assert _head(db) == head


def test_read_by_topics_after_a_position(db: Database) -> None:
    """Reading returns exactly the messages of the given topics after the given position."""
    store = MessageStore(db)
    appended: list[tuple[int, str]] = []
    with db.transaction() as conn:
        for i in range(12):
            topic = "abc"[i % 3]
            (position,) = store.append(conn, topic, f"s{i}", [Changed(i)])
            appended.append((position, topic))
    for after in (0, 4, 11, 12):
        expected = [p for p, t in appended if t in ("a", "c") and p > after]
        assert _positions(_read(db, ["a", "c"], after=after)) == expected
    assert _read(db, ["nothing-here"]) == []


def test_read_rows_carry_the_envelope_and_payload(db: Database) -> None:
    """A read row holds the envelope fields (with headers) and the encoded payload."""
    store = MessageStore(db)
    headers = {"message_id": "m-1", "correlation": "c-9"}
    with db.transaction() as conn:
        store.append(conn, "t", "src-1", [Changed(5)], headers=headers)
    (row,) = _read(db, ["t"])
    envelope = Envelope(*row[:9])
    assert (envelope.position, envelope.topic, envelope.source, envelope.version) == (
        1,
        "t",
        "src-1",
        1,
    )
    assert envelope.type == "test.store.changed"
    assert envelope.partition_hash == partition_hash("src-1")
    assert envelope.headers == headers
    assert envelope.recorded_at > 0
    assert store.registry.decode(envelope.type, row[9], envelope.position) == Changed(5)


def _populate_many_sources(db: Database, sources: int = 600) -> list[tuple[int, str]]:
    """Append 1-3 messages for each of many sources, interleaved; return (position, source)."""
    rng = random.Random(1234)
    names = [f"acct-{i:04d}" for i in range(sources - 3)] + ["kontø-æøå", "账户-✓", "🙂-emoji"]
    pending = [name for name in names for _ in range(rng.randint(1, 3))]
    rng.shuffle(pending)
    encoded = [
        NewMessage(topic="parts", source=s, type="test.store.changed", payload='{"value":0}')
        for s in pending
    ]
    store = MessageStore(db)
    with db.transaction() as conn:
        positions = store.append_encoded(conn, encoded)
    return list(zip(positions, pending, strict=True))


def _expected(
    appended: Sequence[tuple[int, str]], partitions: dict[int, int], count: int
) -> list[int]:
    return [
        position
        for position, source in appended
        if partition_of(source, count) in partitions
        and position > partitions[partition_of(source, count)]
    ]


def test_each_append_records_the_clocks_time_then(database_url: str, table_prefix: str) -> None:
    """Appends record the database clock's time of their own transaction: with a manual
    clock, the time it shows at each append (never the first append's, built in)."""
    clock = ManualClock(5_000.0)
    db = Database(database_url, table_prefix=table_prefix, clock=clock)
    try:
        if not db.is_sqlite:
            migrate(db)
        db.prepare()
        store = MessageStore(db)
        for source in ("a", "b", "c"):
            with db.transaction() as conn:
                store.append(conn, "timed", source, [Changed(1)])
            clock.advance(100.0)
        times = [Envelope(*row[:9]).recorded_at for row in _read(db, ["timed"])]
        assert times == [5_000.0, 5_100.0, 5_200.0]
    finally:
        db.dispose()


@pytest.mark.parametrize(
    "partitions",
    [
        pytest.param({0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0}, id="all-from-zero"),
        pytest.param({i: 500 for i in range(8)}, id="all-one-checkpoint"),
        pytest.param({2: 0, 5: 0}, id="subset-one-checkpoint"),
        pytest.param({1: 0, 3: 300, 6: 700, 7: 10_000}, id="subset-own-checkpoints"),
        pytest.param({i: i * 150 for i in range(8)}, id="all-own-checkpoints"),
        pytest.param({}, id="none"),
    ],
)
def test_partition_filter_matches_python_partitioning(
    db: Database, partitions: dict[int, int]
) -> None:
    """A partitioned read gives exactly the wanted partitions' messages after their checkpoints."""
    appended = _populate_many_sources(db)
    rows = _read(db, ["parts"], partitions=partitions, partition_count=8, limit=10_000)
    assert _positions(rows) == _expected(appended, partitions, 8)
    for row in rows:
        assert row[5] == partition_hash(row[2])
        assert row[5] % 8 in partitions


def test_batch_reads_select_what_reads_select_every_time(db: Database) -> None:
    """read_batch gives read's position, type, payload and partition hash as plain tuples,
    also when the same store reads the same shape again (then straight from the driver)."""
    _populate_many_sources(db, sources=200)
    store = MessageStore(db)
    shapes: list[dict[str, Any]] = [
        {"partitions": {i: 0 for i in range(8)}, "partition_count": 8},
        {"partitions": {1: 0, 3: 120, 6: 240}, "partition_count": 8},
        {"after": 50, "types": ["test.store.changed"]},
    ]
    for _ in range(2):
        for shape in shapes:
            with db.read() as conn:
                full = store.read(conn, ["parts"], limit=100, **shape)
                batch = store.read_batch(conn, ["parts"], limit=100, **shape)
            assert full
            assert batch == [(r[0], r[4], r[9], r[8], r[5]) for r in full]
            assert all(type(row) is tuple for row in batch)


def test_partition_filter_property(db: Database) -> None:
    """For any partition count, partition set and checkpoints, SQL agrees with partition_of."""
    appended = _populate_many_sources(db, sources=300)
    top = appended[-1][0]

    @settings(
        max_examples=examples(25),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        count = data.draw(st.integers(min_value=1, max_value=40), label="count")
        partitions = data.draw(
            st.dictionaries(
                st.integers(min_value=0, max_value=count - 1),
                st.integers(min_value=0, max_value=top),
                max_size=count,
            ),
            label="partitions",
        )
        limit = data.draw(st.integers(min_value=1, max_value=top + 5), label="limit")
        rows = _read(db, ["parts"], partitions=partitions, partition_count=count, limit=limit)
        assert _positions(rows) == _expected(appended, partitions, count)[:limit]

    check()


def test_types_filter(db: Database) -> None:
    """A types filter returns only messages of those stored type names."""
    store = MessageStore(db)
    with db.transaction() as conn:
        for i in range(6):
            store.append(conn, "t", f"s{i % 2}", [Created(str(i)) if i % 3 == 0 else Changed(i)])
    assert _positions(_read(db, ["t"], types=["test.store.created"])) == [1, 4]
    assert _positions(_read(db, ["t"], types=["test.store.changed"])) == [2, 3, 5, 6]
    assert _positions(_read(db, ["t"], types=["test.store.changed"], after=3)) == [5, 6]
    assert _read(db, ["t"], types=[]) == []
    assert _positions(
        _read(db, ["t"], types=["test.store.created"], partitions={0: 0}, partition_count=1)
    ) == [1, 4]


def test_batch_reads_of_some_types_are_what_the_types_filter_selects(db: Database) -> None:
    """read_batch reads without the types filter while the rows it finds are all of the
    types asked for: whether they are or not (before and after another type shows up),
    every batch is what the filter selects, for a store that has read before or not."""
    store = MessageStore(db)
    with db.transaction() as conn:
        store.append(conn, "t", "a", [Changed(i) for i in range(4)])
        store.append(conn, "t", "b", [Created("x")])
        store.append(conn, "t", "a", [Changed(i) for i in range(4, 8)])
    changed, created = "test.store.changed", "test.store.created"
    for types in ([changed], [created, changed], [created]):
        for after, limit in ((0, 3), (0, 4), (2, 3), (3, 3), (4, 2), (0, 9), (0, 3)):
            shape: dict[str, Any] = {"after": after, "limit": limit, "types": types}
            with db.read() as conn:
                selected = [
                    (r[0], r[4], r[9], r[8], r[5]) for r in store.read(conn, ["t"], **shape)
                ]
                assert store.read_batch(conn, ["t"], **shape) == selected, shape
                assert MessageStore(db).read_batch(conn, ["t"], **shape) == selected, shape


def test_limit_and_order_page_through_everything(db: Database) -> None:
    """Reads come in position order, at most ``limit``, and paging by position misses nothing."""
    store = MessageStore(db)
    with db.transaction() as conn:
        for i in range(23):
            store.append(conn, "t", f"s{i % 5}", [Changed(i)])
    assert _positions(_read(db, ["t"], limit=4)) == [1, 2, 3, 4]
    seen: list[int] = []
    after = 0
    while True:
        page = _positions(_read(db, ["t"], after=after, limit=5))
        if not page:
            break
        assert len(page) <= 5
        seen += page
        after = page[-1]
    assert seen == list(range(1, 24))


def test_tenants_do_not_see_each_other(db: Database, database_url: str, table_prefix: str) -> None:
    """Two tenants on the same tables have their own positions, versions, reads and heads."""
    other = Database(database_url, tenant="other-tenant", table_prefix=table_prefix)
    try:
        other.prepare()
        mine, theirs = MessageStore(db), MessageStore(other)
        with db.transaction() as conn:
            mine.append(conn, "t", "shared-source", [Created("mine"), Changed(1)])
        with other.transaction() as conn:
            assert theirs.append(
                conn, "t", "shared-source", [Created("theirs")], expected_version=0
            ) == [1]
        with db.transaction() as conn:
            assert mine.append(conn, "t", "shared-source", [Changed(2)], expected_version=2) == [3]
        assert [(r[0], r[3]) for r in _read(db, ["t"])] == [(1, 1), (2, 2), (3, 3)]
        theirs_rows = _read(other, ["t"])
        assert [(r[0], r[3]) for r in theirs_rows] == [(1, 1)]
        assert theirs.registry.decode(theirs_rows[0][4], theirs_rows[0][9]) == Created("theirs")
        assert _read(other, ["t"], partitions={0: 0}, partition_count=1) == theirs_rows
        assert _head(db) == 3
        assert _head(other) == 1
    finally:
        other.dispose()


def test_empty_append_writes_nothing(db: Database) -> None:
    """Appending no messages returns no positions and leaves the head where it was."""
    store = MessageStore(db)
    with db.transaction() as conn:
        assert store.append(conn, "t", "s", []) == []
        assert store.append_encoded(conn, []) == []
    assert _head(db) == 0
    assert _read(db, ["t"]) == []


def test_head(db: Database) -> None:
    """head() is 0 on an empty store and the last committed position afterwards."""
    store = MessageStore(db)
    assert _head(db) == 0
    with db.transaction() as conn:
        store.append(conn, "t", "s", [Changed(1), Changed(2)])
    assert _head(db) == 2
    with pytest.raises(Boom), db.transaction() as conn:
        store.append(conn, "t", "s", [Changed(3)])
        raise Boom
    assert _head(db) == 2
    with db.transaction() as conn:
        store.append(conn, "u", "s", [Changed(4)])
    assert _head(db) == 3


def test_ids_with_surrounding_whitespace_are_refused(db: Database) -> None:
    """ "a" and "a " would be one source under MySQL's collations: such ids are refused."""
    store = MessageStore(db)
    with pytest.raises(ValueError, match="whitespace"), db.transaction() as conn:
        store.append(conn, "t", "a ", [Changed(2)])
    with pytest.raises(ValueError, match="whitespace"), db.transaction() as conn:
        store.append(conn, " t", "a", [Changed(2)])
    with db.read() as conn:
        assert store.read(conn, ["t", " t"]) == []
