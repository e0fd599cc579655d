"""Ownership fencing on SQLite and MySQL: claims, epochs, fenced checkpoints, lost partitions."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    CursorResult,
    Executable,
    MetaData,
    String,
    Table,
    insert,
    select,
    update,
)

from messaging import (
    CheckpointMoved,
    Database,
    HandlerContext,
    MessageStore,
    OwnershipLost,
    Settings,
    create_plugin_manager,
    handler,
    hookimpl,
    message,
)
from messaging._consumers import consumer_spec
from messaging._errors import UnknownPayloadVersion
from messaging._messages import registry
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._needs import leave
from messaging.distribution._ownership import Claim, Ownership
from messaging.store._clock import ManualClock
from messaging.store._rows import partition_of
from projections import projection

STALE = 30.0
CONSUMER = "fence-consumer"


@message("test.fence.bumped")
@attrs.define(frozen=True)
class Bumped:
    key: str


def _read_model(prefix: str) -> Table:
    return Table(
        f"{prefix}fence_read_model",
        MetaData(),
        Column("position", BigInteger, primary_key=True, autoincrement=False),
        Column("key", String(64), nullable=False),
    )


@pytest.fixture
def read_model(db: Database) -> Table:
    """A small read-model table named with the test's prefix (dropped with the prefix)."""
    table = _read_model(db.schema.prefix)
    with db.transaction() as conn:
        table.create(conn)
    return table


@pytest.fixture
def later_db(database_url: str, table_prefix: str) -> Iterator[Database]:
    """The same tables seen through a clock an hour ahead: every real heartbeat looks stale."""
    database = Database(
        database_url, table_prefix=table_prefix, clock=ManualClock(time.time() + 3600)
    )
    yield database
    database.dispose()


def _register(db: Database, instance_id: str) -> None:
    with db.transaction() as conn:
        Membership(db).register(
            conn, InstanceInfo(id=instance_id, name=instance_id, host="test-host", pid=1)
        )


def _claim(db: Database, instance_id: str, partitions: Sequence[int]) -> list[Claim]:
    with db.transaction() as conn:
        return Ownership(db).claim(
            conn, CONSUMER, partitions, instance_id, Membership(db).live_ids(STALE)
        )


def _rows(db: Database) -> dict[int, tuple[str | None, int, int]]:
    with db.read() as conn:
        return {
            r.partition: (r.owner, r.epoch, r.checkpoint)
            for r in Ownership(db).partitions(conn, [CONSUMER])
        }


def _read_model_positions(db: Database, table: Table) -> list[int]:
    with db.read() as conn:
        return sorted(conn.execute(select(table.c.position)).scalars())


@pytest.fixture
def partitions(db: Database) -> int:
    """Four fresh partitions of the test consumer, and instance ``a`` registered live."""
    with db.transaction() as conn:
        Ownership(db).ensure_partitions(conn, CONSUMER, 4)
    _register(db, "a")
    return 4


def test_claim_bumps_the_epoch(db: Database, partitions: int) -> None:
    """Claiming unowned partitions makes the claimer their owner under epoch + 1."""
    assert _rows(db) == {p: (None, 0, 0) for p in range(4)}
    claims = _claim(db, "a", [0, 2])
    assert sorted(claims, key=lambda c: c.partition) == [
        Claim(partition=0, epoch=1, checkpoint=0),
        Claim(partition=2, epoch=1, checkpoint=0),
    ]
    assert _rows(db)[0] == ("a", 1, 0)
    assert _rows(db)[1] == (None, 0, 0)
    with db.transaction() as conn:
        Ownership(db).release(conn, CONSUMER, "a", [0])
    assert _rows(db)[0] == (None, 1, 0)
    (again,) = _claim(db, "a", [0])
    assert again.epoch == 2
    assert _rows(db)[0] == ("a", 2, 0)


def test_claiming_a_partition_of_a_live_instance_does_nothing(
    db: Database, partitions: int
) -> None:
    """A partition owned by another live instance stays with it, under the same epoch."""
    _claim(db, "a", [0, 1])
    _register(db, "b")
    assert _claim(db, "b", [0, 1]) == []
    assert _rows(db)[0] == ("a", 1, 0)
    assert _rows(db)[1] == ("a", 1, 0)


def test_reclaim_by_the_owner_fences_out_its_old_epoch(db: Database, partitions: int) -> None:
    """Every claim bumps the epoch, so a re-claim leaves the previous epoch unable to commit."""
    (first,) = _claim(db, "a", [0])
    (second,) = _claim(db, "a", [0])
    assert second.epoch == first.epoch + 1
    with pytest.raises(OwnershipLost), db.transaction() as conn:
        Ownership(db).commit_checkpoint(conn, CONSUMER, "a", {0: first}, 3)
    assert _rows(db)[0] == ("a", second.epoch, 0)


def test_a_partition_left_for_a_newer_declaration_is_claimed_only_by_a_round_that_read_it(
    db: Database, partitions: int
) -> None:
    """A round that read the rows before its own instance left a partition (for a newer
    payload) does not claim it back: the claim names the records it read."""
    (claim,) = _claim(db, "a", [1])
    needed = UnknownPayloadVersion("test.fence.bumped", 2, position=5)
    assert leave(db, CONSUMER, claim, "a", needed)
    with db.transaction() as conn:
        ownership, live = Ownership(db), Membership(db).live_ids(STALE)
        assert ownership.claim(conn, CONSUMER, [1], "a", live) == []  # read before the leave
        (again,) = ownership.claim(conn, CONSUMER, [1], "a", live, needs_read=[1])
    assert again.epoch == claim.epoch + 1


def test_halted_partition_is_neither_claimed_nor_checkpointed(
    db: Database, later_db: Database, partitions: int
) -> None:
    """A halted partition cannot be claimed by anyone nor checkpointed by its owner."""
    (claim,) = _claim(db, "a", [3])
    with db.transaction() as conn:
        assert Ownership(db).halt(
            conn, CONSUMER, claim, "a", position=4, type_name="t", error="boom"
        )
    assert _claim(db, "a", [3]) == []
    _register(later_db, "b")
    assert _claim(later_db, "b", [3]) == []
    assert _rows(db)[3] == ("a", 1, 0)
    with pytest.raises(OwnershipLost), db.transaction() as conn:
        Ownership(db).commit_checkpoint(conn, CONSUMER, "a", {3: claim}, 9)
    with db.read() as conn:
        (row,) = [r for r in Ownership(db).partitions(conn, [CONSUMER]) if r.partition == 3]
    assert (row.status, row.halted_position, row.checkpoint) == ("halted", 4, 0)


def test_partition_of_a_stale_instance_can_be_claimed(
    db: Database, later_db: Database, partitions: int
) -> None:
    """Once its owner's heartbeat is older than the stale timeout, a partition can be taken over."""
    _claim(db, "a", [0, 1])
    _register(later_db, "b")
    claims = _claim(later_db, "b", [0])
    assert claims == [Claim(partition=0, epoch=2, checkpoint=0)]
    assert _rows(db)[0] == ("b", 2, 0)
    assert _rows(db)[1] == ("a", 1, 0)


def test_stale_heartbeat_in_the_database_clock_allows_a_claim(
    db: Database, partitions: int
) -> None:
    """With the database clock, an owner whose heartbeat_at is too old is no longer live."""
    _claim(db, "a", [3])
    _register(db, "b")
    assert _claim(db, "b", [3]) == []
    instances = db.schema.instances
    with db.transaction() as conn:
        conn.execute(
            update(instances)
            .where(instances.c.id == "a")
            .values(heartbeat_at=instances.c.heartbeat_at - 2 * STALE)
        )
    assert _claim(db, "b", [3]) == [Claim(partition=3, epoch=2, checkpoint=0)]


def test_fenced_checkpoint_commits_with_the_read_model(
    db: Database, partitions: int, read_model: Table
) -> None:
    """The owner under the current epoch commits its read-model writes and its checkpoint."""
    (claim,) = _claim(db, "a", [0])
    with db.transaction() as conn:
        conn.execute(insert(read_model), {"position": 5, "key": "k"})
        Ownership(db).commit_checkpoint(conn, CONSUMER, "a", {0: claim}, 5)
    assert _read_model_positions(db, read_model) == [5]
    assert _rows(db)[0] == ("a", 1, 5)


def test_stale_epoch_raises_and_rolls_back_the_read_model(
    db: Database, later_db: Database, partitions: int, read_model: Table
) -> None:
    """A checkpoint under a superseded epoch raises OwnershipLost and its writes roll back."""
    claims = {c.partition: c for c in _claim(db, "a", [0, 1])}
    _register(later_db, "b")
    _claim(later_db, "b", [0])
    with pytest.raises(OwnershipLost) as info, db.transaction() as conn:
        conn.execute(insert(read_model), [{"position": 7, "key": "x"}, {"position": 8, "key": "y"}])
        Ownership(db).commit_checkpoint(conn, CONSUMER, "a", {0: claims[0], 1: claims[1]}, 8)
    assert info.value.consumer == CONSUMER
    assert info.value.partitions == [0]
    assert _read_model_positions(db, read_model) == []
    assert _rows(db)[0] == ("b", 2, 0)
    assert _rows(db)[1] == ("a", 1, 0), "the partition still owned rolled back too"


def test_a_fence_reused_batch_after_batch_still_fails_once_ownership_moved(
    db: Database, later_db: Database, partitions: int, read_model: Table
) -> None:
    """The cached fence statement (sent straight to the driver from its second use on)
    rejects a superseded epoch and rolls the writes back."""
    (claim,) = _claim(db, "a", [0])
    ownership = Ownership(db)
    for position in (3, 4):
        with db.transaction() as conn:
            ownership.commit_checkpoint(conn, CONSUMER, "a", {0: claim}, position)
        claim = attrs.evolve(claim, checkpoint=position)
    _register(later_db, "b")
    _claim(later_db, "b", [0])
    with pytest.raises(OwnershipLost) as info, db.transaction() as conn:
        conn.execute(insert(read_model), {"position": 5, "key": "k"})
        ownership.commit_checkpoint(conn, CONSUMER, "a", {0: claim}, 5)
    assert info.value.partitions == [0]
    assert _read_model_positions(db, read_model) == []
    assert _rows(db)[0] == ("b", 2, 4)


def test_checkpoint_by_a_non_owner_raises(db: Database, partitions: int) -> None:
    """An instance that does not own a partition cannot checkpoint it, even with its epoch."""
    (claim,) = _claim(db, "a", [2])
    with pytest.raises(OwnershipLost) as info, db.transaction() as conn:
        Ownership(db).commit_checkpoint(conn, CONSUMER, "b", {2: claim}, 3)
    assert info.value.partitions == [2]
    assert _rows(db)[2] == ("a", 1, 0)


def test_checkpoints_never_decrease(db: Database, partitions: int) -> None:
    """Committing a lower position after a higher one keeps the higher checkpoint."""
    (claim,) = _claim(db, "a", [1])
    ownership = Ownership(db)
    for position, expected in [(10, 10), (4, 10), (10, 10), (12, 12), (0, 12)]:
        with db.transaction() as conn:
            ownership.commit_checkpoint(conn, CONSUMER, "a", {1: claim}, position)
        assert _rows(db)[1] == ("a", 1, expected)
        claim = attrs.evolve(claim, checkpoint=expected)


def test_a_batch_committed_again_from_the_same_checkpoint_rolls_back(
    db: Database, partitions: int, read_model: Table
) -> None:
    """The fence is a compare-and-set on the checkpoint too: a batch committed again from the
    checkpoint it was read from (its first commit went through unacknowledged) raises
    CheckpointMoved with the stored checkpoints, and its writes roll back."""
    claims = {c.partition: c for c in _claim(db, "a", [0, 1])}
    with db.transaction() as conn:
        conn.execute(insert(read_model), {"position": 5, "key": "k"})
        Ownership(db).commit_checkpoint(conn, CONSUMER, "a", claims, 5)
    with pytest.raises(CheckpointMoved) as info, db.transaction() as conn:
        conn.execute(insert(read_model), {"position": 6, "key": "again"})
        Ownership(db).commit_checkpoint(conn, CONSUMER, "a", claims, 5)
    assert info.value.checkpoints == {0: 5, 1: 5}
    assert _read_model_positions(db, read_model) == [5]
    assert _rows(db)[0] == ("a", 1, 5)


def test_the_fence_with_its_expected_checkpoints_goes_straight_to_the_driver(
    db: Database, partitions: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expected checkpoints are bound parameters: from its second use on, the cached
    fence skips SQLAlchemy (no ``Connection.execute``), batch after batch."""
    (claim,) = _claim(db, "a", [0])
    ownership = Ownership(db)
    with db.transaction() as conn:
        ownership.commit_checkpoint(conn, CONSUMER, "a", {0: claim}, 3)
    executed: list[object] = []
    original = Connection.execute

    def counting(
        conn: Connection, statement: Executable, *args: Any, **kwargs: Any
    ) -> CursorResult[Any]:
        executed.append(statement)
        return original(conn, statement, *args, **kwargs)

    monkeypatch.setattr(Connection, "execute", counting)
    for position in (4, 5):
        claim = attrs.evolve(claim, checkpoint=position - 1)
        with db.transaction() as conn:
            ownership.commit_checkpoint(conn, CONSUMER, "a", {0: claim}, position)
    assert executed == []
    assert _rows(db)[0] == ("a", 1, 5)


# -- the worker -----------------------------------------------------------------------------


class Recorder:
    """A plugin that records lifecycle hooks."""

    def __init__(self) -> None:
        self.released: list[tuple[str, int, str]] = []
        self.applied: list[tuple[list[int], int, int]] = []

    @hookimpl
    def projections_partition_released(
        self, consumer: str, partition: int, instance_id: str
    ) -> None:
        self.released.append((consumer, partition, instance_id))

    @hookimpl
    def projections_batch_applied(
        self,
        consumer: str,
        partitions: Sequence[int],
        count: int,
        last_position: int,
        seconds: float,
    ) -> None:
        self.applied.append((list(partitions), count, last_position))


def _projection_class(table: Table) -> type:
    statement = insert(table)

    @projection(CONSUMER, topics="fence", partitions=4, tables=[table])
    class FenceProjection:
        @handler
        def bumped(self, event: Bumped, ctx: HandlerContext) -> None:
            assert ctx.envelope is not None
            ctx.execute(statement, {"position": ctx.envelope.position, "key": event.key})

    return FenceProjection


def _source_in(partition: int, index: int) -> str:
    return next(
        key
        for key in (f"src-{partition}-{index}-{n}" for n in range(10_000))
        if partition_of(key, 4) == partition
    )


def _append_round(db: Database, index: int) -> dict[int, int]:
    """Append two messages in each partition; return position -> partition."""
    store = MessageStore(db)
    placed: dict[int, int] = {}
    with db.transaction() as conn:
        for repeat in range(2):
            for partition in range(4):
                source = _source_in(partition, index * 10 + repeat)
                (position,) = store.append(conn, "fence", source, [Bumped(source)])
                placed[position] = partition
    return placed


def _worker(db: Database, instance_id: str, table: Table, hooks: Recorder) -> ConsumerWorker:
    return ConsumerWorker(
        db=db,
        spec=consumer_spec(_projection_class(table)),
        instance_id=instance_id,
        instance_name=instance_id,
        settings=Settings().messaging.consumer,
        hooks=create_plugin_manager([], plugins=[hooks], load_entrypoints=False).hook,
        registry=registry,
    )


def test_worker_applies_nothing_after_losing_a_partition(
    db: Database, later_db: Database, partitions: int, read_model: Table
) -> None:
    """After a takeover, poll() rolls the whole batch back and drops only the lost partition."""
    recorder = Recorder()
    worker = _worker(db, "a", read_model, recorder)
    worker.add_claims(_claim(db, "a", range(4)))

    first = _append_round(db, 0)
    assert worker.poll() == len(first)
    assert _read_model_positions(db, read_model) == sorted(first)
    assert {p: row[2] for p, row in _rows(db).items()} == dict.fromkeys(range(4), max(first))

    second = _append_round(db, 1)
    _register(later_db, "b")
    (taken,) = _claim(later_db, "b", [2])
    assert taken.epoch == 2

    assert worker.poll() == 0
    assert _read_model_positions(db, read_model) == sorted(first)
    assert sorted(worker.claims()) == [0, 1, 3]
    assert recorder.released == [(CONSUMER, 2, "a")]
    assert _rows(db)[2] == ("b", 2, max(first))
    assert all(_rows(db)[p][2] == max(first) for p in (0, 1, 3))

    kept = sorted(p for p, part in second.items() if part != 2)
    assert worker.poll() == len(kept)
    assert _read_model_positions(db, read_model) == sorted([*first, *kept])
    assert all(_rows(db)[p] == ("a", 1, kept[-1]) for p in (0, 1, 3))
    assert _rows(db)[2] == ("b", 2, max(first))

    successor = _worker(later_db, "b", read_model, Recorder())
    successor.add_claims([taken])
    assert successor.poll() == 2
    assert _read_model_positions(db, read_model) == sorted([*first, *second])


def test_worker_with_a_stale_claim_on_its_only_partition_applies_nothing(
    db: Database, later_db: Database, partitions: int, read_model: Table
) -> None:
    """A worker whose single partition was taken over applies nothing and stops polling it."""
    recorder = Recorder()
    worker = _worker(db, "a", read_model, recorder)
    worker.add_claims(_claim(db, "a", [1]))
    placed = _append_round(db, 0)
    _register(later_db, "b")
    _claim(later_db, "b", [1])
    assert worker.poll() == 0
    assert worker.claims() == {}
    assert worker.poll() == 0
    assert _read_model_positions(db, read_model) == []
    assert recorder.applied == []
    assert recorder.released == [(CONSUMER, 1, "a")]
    assert _rows(db)[1] == ("b", 2, 0)
    assert len(placed) == 8
