"""A read split by lane: no lane takes more than its share, and each batch's checkpoint
stays where its read of that lane's partitions is complete."""

from __future__ import annotations

from messaging.distribution._ownership import Claim
from messaging.runtime._batch import split_lanes

PARTITIONS = 4
LANES = 2


def _claims(*partitions: int) -> dict[int, Claim]:
    return {p: Claim(partition=p, epoch=1, checkpoint=0) for p in partitions}


def _row(position: int, partition: int) -> tuple[object, ...]:
    return (position, "t", "{}", 1, partition)  # position, type, payload, version, hash


def test_a_lane_behind_takes_its_share_and_commits_at_its_last_row() -> None:
    # Lane 0 (partitions 0 and 2) is behind: its rows come first and fill the read.
    rows = [_row(1, 0), _row(2, 2), _row(3, 0), _row(4, 2), _row(5, 1), _row(6, 0)]
    behind, ahead = split_lanes(_claims(0, 1, 2, 3), rows, PARTITIONS, LANES, most=3)
    assert [r[0] for r in behind.rows or ()] == [1, 2, 3]
    assert behind.through == 3  # its rows 4 and 6 are read again next time
    assert sorted(behind.claims) == [0, 2]
    assert [r[0] for r in ahead.rows or ()] == [5]
    assert ahead.through == 6  # the read held every row of lane 1 up to its end
    assert behind.checkpoint(behind.rows or ()) == 3


def test_a_lane_within_its_share_commits_at_the_end_of_the_read() -> None:
    rows = [_row(1, 0), _row(2, 1), _row(3, 2)]
    first, second = split_lanes(_claims(0, 1, 2, 3), rows, PARTITIONS, LANES, most=3)
    assert (first.through, second.through) == (3, 3)
    assert [r[0] for r in first.rows or ()] == [1, 3]


def test_the_partitions_of_a_lane_without_rows_go_with_the_first_lane() -> None:
    rows = [_row(1, 1), _row(2, 3), _row(3, 1)]
    (batch,) = split_lanes(_claims(0, 1, 2, 3), rows, PARTITIONS, LANES, most=3)
    assert sorted(batch.claims) == [0, 1, 2, 3]
    assert batch.through == 3


def test_a_lane_alone_in_the_read_takes_all_of_it() -> None:
    rows = [_row(1, 0), _row(2, 2), _row(3, 0), _row(4, 2)]
    (batch,) = split_lanes(_claims(0, 1, 2, 3), rows, PARTITIONS, LANES, most=2)
    assert [r[0] for r in batch.rows or ()] == [1, 2, 3, 4]
    assert batch.through == 4
