"""A read split among the free lanes: whole partitions, as even in rows as can be, each
batch in position order and committing where the read is complete."""

from __future__ import annotations

from messaging.applying._batch import split_lanes
from messaging.distribution._ownership import Claim

PARTITIONS = 8


def _claims(*partitions: int) -> dict[int, Claim]:
    return {p: Claim(partition=p, epoch=1, checkpoint=0) for p in partitions}


def _row(position: int, partition: int) -> tuple[object, ...]:
    return (position, "t", "{}", 1, partition)  # position, type, payload, version, hash


def _positions(rows: object) -> list[object]:
    return [r[0] for r in rows or ()]  # type: ignore[attr-defined]


def test_partitions_that_share_a_residue_go_to_different_lanes() -> None:
    # 0 and 4 (and 1 and 5) would share a lane as p % 4: each gets one of its own.
    rows = [_row(1, 0), _row(2, 4), _row(3, 0), _row(4, 4), _row(5, 1), _row(6, 5)]
    batches = split_lanes(_claims(0, 1, 4, 5), rows, PARTITIONS, 4)
    assert sorted(sorted(b.claims) for b in batches) == [[0], [1], [4], [5]]
    assert all(b.through == 6 for b in batches)


def test_lanes_are_even_in_rows_and_each_batch_keeps_position_order() -> None:
    rows = [_row(n, p) for n, p in enumerate([0, 1, 0, 2, 0, 3, 0, 1], start=1)]
    heavy, light = split_lanes(_claims(0, 1, 2, 3), rows, PARTITIONS, 2)
    assert sorted(heavy.claims) == [0]  # four rows: alone
    assert _positions(heavy.rows) == [1, 3, 5, 7]
    assert sorted(light.claims) == [1, 2, 3]  # four rows between them
    assert _positions(light.rows) == [2, 4, 6, 8]
    assert heavy.checkpoint(heavy.rows or ()) == light.checkpoint(light.rows or ()) == 8


def test_the_partitions_without_rows_go_with_the_lightest_batch() -> None:
    rows = [_row(1, 1), _row(2, 3), _row(3, 1)]
    heavy, light = split_lanes(_claims(0, 1, 2, 3), rows, PARTITIONS, 4)
    assert sorted(heavy.claims) == [1]
    assert sorted(light.claims) == [0, 2, 3]
    assert light.through == 3  # they had nothing up to the end of the read


def test_no_more_batches_than_lanes_or_partitions_with_rows() -> None:
    rows = [_row(n, n % 6) for n in range(1, 13)]
    assert len(split_lanes(_claims(*range(6)), rows, PARTITIONS, 4)) == 4
    assert len(split_lanes(_claims(*range(6)), rows[:2], PARTITIONS, 4)) == 2
    assert split_lanes(_claims(0, 1), [], PARTITIONS, 4) == []


def test_a_lane_applies_at_most_a_batch_and_commits_after_its_last_row() -> None:
    rows = [_row(n, p) for n, p in enumerate([0, 0, 1, 0, 0], start=1)]
    heavy, light = split_lanes(_claims(0, 1), rows, PARTITIONS, 2, size=2)
    assert _positions(heavy.rows) == [1, 2] and heavy.through == 2  # 4 and 5 read again
    assert _positions(light.rows) == [3] and light.through == 5
