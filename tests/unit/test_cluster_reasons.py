"""Why the instance serving the cluster page applies a consumer or not, one reason each
(:func:`projections._cluster.applies_here`), and the range gauges' contiguous ranges."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from projections._cluster import NO_LIVE_MEMBER, NOT_A_MEMBER, Here, applies_here
from projections_otel import NOT_CONTIGUOUS, contiguous_range

ME = Here(
    id="me",
    name="alpha",
    declared=frozenset({"c"}),
    runs=frozenset({"c"}),
    applies=frozenset({"c"}),
)
MEMBERS = [{"id": "me"}, {"id": "other"}]


def _consumer(
    owners: list[str | None], *, halted: tuple[int, ...] = (), **fields: Any
) -> dict[str, Any]:
    parts = [
        {
            "partition": n,
            "instance": owner,
            "instance_id": owner,
            "state": "OWNED" if owner else "UNCLAIMED",
            "status": "halted" if n in halted else "running",
        }
        for n, owner in enumerate(owners)
    ]
    return {
        "name": "c",
        "distribution": "partitioned",
        "state": "running",
        "partitions": parts,
        **fields,
    }


@pytest.mark.parametrize(
    ("consumer", "here", "members", "why", "words"),
    [
        (_consumer(["me", "other"]), ME, MEMBERS, "applies", "applies 1 of its 2"),
        (_consumer(["me", "me"], halted=(1,)), ME, MEMBERS, "applies", "1 partition(s) halted"),
        (_consumer(["me"]), None, MEMBERS, "not-a-member", NOT_A_MEMBER),
        (_consumer(["me"]), attrs.evolve(ME, stopping=True), MEMBERS, "stopping", "stopping"),
        (
            _consumer(["me"]),
            attrs.evolve(ME, outage="the database is unreachable"),
            MEMBERS,
            "outage",
            "outage: the database is unreachable",
        ),
        (_consumer(["me", "me"], halted=(0, 1)), ME, MEMBERS, "halted", "projections resume c"),
        (_consumer([None, None], halted=(0,)), ME, MEMBERS, "halted", "1 partition(s) halted"),
        (_consumer([None], state="paused"), ME, MEMBERS, "paused", "projections resume c"),
        (
            _consumer([None]),
            attrs.evolve(ME, declared=frozenset()),
            MEMBERS,
            "not-declared",
            "not declare",
        ),
        (
            _consumer([None]),
            attrs.evolve(ME, runs=frozenset()),
            MEMBERS,
            "older-declaration",
            "older",
        ),
        (_consumer([None], name="c@2", version_of="c"), ME, MEMBERS, "older-declaration", "older"),
        (
            _consumer([None]),
            attrs.evolve(ME, applies=frozenset({"c@2"})),
            MEMBERS,
            "newer-declaration",
            "newer declaration",
        ),
        (
            _consumer([None]),
            attrs.evolve(ME, waiting={"c": "instances ['x'] still run it partitioned"}),
            MEMBERS,
            "waiting",
            "still run it partitioned",
        ),
        (
            _consumer(["other"], distribution="single-owner"),
            ME,
            MEMBERS,
            "standby",
            "single-owner standby: other applies it",
        ),
        (_consumer(["other", "other"]), ME, MEMBERS, "owned-elsewhere", "other members own every"),
        (_consumer([None]), ME, MEMBERS, "owned-elsewhere", "next rebalance round"),
        (_consumer([None]), ME, [], "no-live-member", NO_LIVE_MEMBER),
    ],
)
def test_each_reason(
    consumer: dict[str, Any], here: Here | None, members: list[dict[str, Any]], why: str, words: str
) -> None:
    answer = applies_here(consumer, members, here)
    assert answer["why"] == why
    assert answer["applies"] is (why == "applies")
    assert words in answer["reason"]


def test_partitions_waiting_for_a_newer_declaration_are_an_older_declaration_here() -> None:
    consumer = _consumer([None, None])
    for p in consumer["partitions"]:
        p["waiting"] = "needs an instance reading test.x v2"
    answer = applies_here(consumer, MEMBERS, ME)
    assert answer["why"] == "older-declaration" and "reading test.x v2" in answer["reason"]


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [
        ([], (0, 0)),
        ([3], (3, 4)),
        ([0, 1, 2], (0, 3)),
        ([2, 0, 1], (0, 3)),
        ([0, 2], (NOT_CONTIGUOUS, NOT_CONTIGUOUS)),
    ],
)
def test_contiguous_ranges_are_half_open(partitions: list[int], expected: tuple[int, int]) -> None:
    assert contiguous_range(partitions) == expected
