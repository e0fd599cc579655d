"""Rebalance planning from membership and ownership rows."""

from __future__ import annotations

from typing import Any

import attrs

from messaging._settings import Distribution
from messaging.distribution._membership import InstanceRow
from messaging.distribution._rebalance import plan

P, S = Distribution.PARTITIONED, Distribution.SINGLE_OWNER
FP = {"c1": "f", "c2": "f"}


def member(instance_id: str, fingerprint: str = "f", **runs: Distribution) -> InstanceRow:
    return InstanceRow(
        id=instance_id,
        name=instance_id,
        host="h",
        pid=1,
        started_at=0.0,
        heartbeat_at=0.0,
        stopping=False,
        live=True,
        runs={c: {"distribution": d.value, "fingerprint": fingerprint} for c, d in runs.items()},
    )


def test_a_joiner_is_assigned_only_partitions_taken_from_others() -> None:
    """With a and b holding 4 each, c is assigned 2 and a and b each release one."""
    owners = {"c1": {p: ("a" if p < 4 else "b") for p in range(8)}}
    live = [member("a", c1=P), member("b", c1=P), member("c", c1=P)]
    plans = {me: plan(me, live, owners, {"c1": 8}, {"c1": P}, FP)["c1"] for me in "abc"}
    assert len(plans["c"].target) == 2 and not plans["c"].release
    assert len(plans["a"].release) + len(plans["b"].release) == 2
    assert plans["c"].target == plans["a"].release | plans["b"].release


def test_every_instance_computes_the_same_target() -> None:
    """The plans of all members partition the units with no overlap."""
    owners = {"c1": {p: None for p in range(10)}}
    live = [member(x, c1=P) for x in "xyz"]
    targets = [plan(me, live, owners, {"c1": 10}, {"c1": P}, FP)["c1"].target for me in "xyz"]
    assert sorted(p for t in targets for p in t) == list(range(10))


def test_single_owner_elects_one_instance_for_all_partitions() -> None:
    """Exactly one single-owner member targets every partition; the other stands by."""
    owners = {"c1": {p: None for p in range(4)}}
    live = [member("a", c1=S), member("b", c1=S)]
    plans = [plan(me, live, owners, {"c1": 4}, {"c1": S}, FP)["c1"] for me in "ab"]
    assert sorted(len(p.target) for p in plans) == [0, 4]


def test_single_owner_consumers_are_spread_across_instances() -> None:
    """Two single-owner consumers on two instances get one owner each."""
    owners = {"c1": {0: None}, "c2": {0: None}}
    live = [member("a", c1=S, c2=S), member("b", c1=S, c2=S)]
    mine = {
        me: {
            c
            for c, p in plan(me, live, owners, {"c1": 1, "c2": 1}, {"c1": S, "c2": S}, FP).items()
            if p.target
        }
        for me in "ab"
    }
    assert mine["a"] and mine["b"] and not mine["a"] & mine["b"]


def test_single_owner_waits_while_a_live_instance_runs_it_partitioned() -> None:
    """During a rolling switch, the single-owner side applies nothing and says why."""
    owners = {"c1": {0: "old", 1: "old"}}
    live = [member("old", c1=P), member("new", c1=S)]
    new = plan("new", live, owners, {"c1": 2}, {"c1": S}, FP)["c1"]
    assert not new.target and new.waiting_for and "old" in new.waiting_for
    old = plan("old", live, owners, {"c1": 2}, {"c1": P}, FP)["c1"]
    assert old.target == {0, 1}


def test_instances_on_another_declaration_do_not_share_the_consumer() -> None:
    """A live instance running an older declaration is not a member: it gets nothing."""
    stale = member("old", fingerprint="g", c1=P)
    owners = {"c1": {p: None for p in range(4)}}
    new = plan("new", [stale, member("new", c1=P)], owners, {"c1": 4}, {"c1": P}, FP)["c1"]
    assert new.target == {0, 1, 2, 3}


def test_remainders_of_many_consumers_spread_over_the_instances() -> None:
    """10 consumers of 8 partitions over 3 fresh instances: 27 / 27 / 26, every instance's
    plans agree, and a fourth instance joining takes partitions only from the others."""
    names = [f"c{k:02}" for k in range(10)]
    fingerprints = dict.fromkeys(names, "f")
    counts = dict.fromkeys(names, 8)
    modes: dict[str, Any] = dict.fromkeys(names, P)  # the runs: keyword arguments of member
    live = [member(x, **modes) for x in "xyz"]
    owners: dict[str, dict[int, str | None]] = {c: dict.fromkeys(range(8)) for c in names}
    plans = {me: plan(me, live, owners, counts, modes, fingerprints) for me in "xyz"}
    for consumer in names:
        targets = [plans[me][consumer].target for me in "xyz"]
        assert sorted(p for t in targets for p in t) == list(range(8))
    assert sorted(sum(len(plans[me][c].target) for c in names) for me in "xyz") == [26, 27, 27]

    held = {c: {p: me for me in "xyz" for p in plans[me][c].target} for c in names}
    joined = [*live, member("w", **modes)]
    after = {me: plan(me, joined, held, counts, modes, fingerprints) for me in "wxyz"}
    for consumer in names:
        for me in "xyz":
            assert not after[me][consumer].target - plans[me][consumer].target
        assert after["w"][consumer].target == set().union(
            *(after[me][consumer].release for me in "xyz")
        )


def test_a_partition_needing_a_newer_declaration_goes_only_to_an_instance_that_has_it() -> None:
    """Partition 1 needs ``t`` version 3: only ``new`` (which reads it) targets it, every
    instance computing the same; with no such instance live, nobody does (it waits)."""
    owners = {"c1": {0: "old", 1: "old", 2: "new", 3: "new"}}
    old, new = member("old", c1=P), member("new", c1=P)
    new = attrs.evolve(new, runs={"c1": {**new.runs["c1"], "reads": {"t": 3}}})
    old = attrs.evolve(old, runs={"c1": {**old.runs["c1"], "reads": {"t": 2}}})
    needs = {"c1": {1: ("t", 3)}}
    reads = {"old": {"c1": {"t": 2}}, "new": {"c1": {"t": 3}}}
    plans = {
        me: plan(me, [old, new], owners, {"c1": 4}, {"c1": P}, FP, needs, reads[me])["c1"]
        for me in ("old", "new")
    }
    assert 1 in plans["new"].target and 1 not in plans["old"].target
    assert 1 in plans["old"].release
    assert plans["old"].target | plans["new"].target == {0, 1, 2, 3}
    alone = plan("old", [old], owners, {"c1": 4}, {"c1": P}, FP, needs, reads["old"])["c1"]
    assert alone.target == {0, 2, 3}


def test_a_partition_that_needed_a_newer_declaration_stays_with_those_that_have_it() -> None:
    """Partitions 1 and 2 needed ``t`` version 3 and their checkpoints passed those
    messages: the stream carries payloads ``old`` cannot read, so ``new`` takes every
    partition (any may meet one next; balance would hand some to ``old``, which would
    leave them again); with no instance that reads it live, ``old`` takes them all."""
    owners = {"c1": {0: "old", 1: "new", 2: "new", 3: "old"}}
    old, new = member("old", c1=P), member("new", c1=P)
    new = attrs.evolve(new, runs={"c1": {**new.runs["c1"], "reads": {"t": 3}}})
    old = attrs.evolve(old, runs={"c1": {**old.runs["c1"], "reads": {"t": 2}}})
    recorded = {"c1": {1: ("t", 3), 2: ("t", 3)}}
    reads = {"old": {"c1": {"t": 2}}, "new": {"c1": {"t": 3}}}
    plans = {
        me: plan(me, [old, new], owners, {"c1": 4}, {"c1": P}, FP, {}, reads[me], recorded)["c1"]
        for me in ("old", "new")
    }
    assert plans["new"].target == {0, 1, 2, 3} and not plans["old"].target
    assert plans["old"].release == {0, 3}
    alone = plan("old", [old], owners, {"c1": 4}, {"c1": P}, FP, {}, reads["old"], recorded)
    assert alone["c1"].target == {0, 1, 2, 3}


def test_an_elected_single_owner_leaves_a_partition_it_cannot_read_waiting() -> None:
    """Single-owner: the elected instance claims every partition but one needing a newer
    declaration than its own (which it would only release again)."""
    owners = {"c1": {p: "a" for p in range(4)}}
    live = [member("a", c1=S)]
    needs = {"c1": {2: ("t", 3)}}
    mine = plan("a", live, owners, {"c1": 4}, {"c1": S}, FP, needs, {"c1": {"t": 2}})["c1"]
    assert mine.target == {0, 1, 3} and mine.release == {2}
    assert mine.waiting_for == (
        "its partition 2 needs a newer declaration of type 't' version 3, which no instance "
        "running it has"
    )
    able = plan("a", live, owners, {"c1": 4}, {"c1": S}, FP, needs, {"c1": {"t": 3}})["c1"]
    assert able.target == {0, 1, 2, 3} and not able.release


def test_a_single_owner_consumer_needing_a_newer_declaration_moves_to_an_instance_with_it() -> None:
    """Single-owner: ``old`` holds the consumer, but partition 2 needs ``t`` version 3, which
    only ``new`` reads: every instance elects ``new``, ``old`` releases every partition;
    once nothing is needed, the holder keeps it (sticky)."""
    owners = {"c1": {p: "old" for p in range(4)}}
    old, new = member("old", c1=S), member("new", c1=S)
    old = attrs.evolve(old, runs={"c1": {**old.runs["c1"], "reads": {"t": 2}}})
    new = attrs.evolve(new, runs={"c1": {**new.runs["c1"], "reads": {"t": 3}}})
    reads = {"old": {"c1": {"t": 2}}, "new": {"c1": {"t": 3}}}
    needs = {"c1": {2: ("t", 3)}}
    plans = {
        me: plan(me, [old, new], owners, {"c1": 4}, {"c1": S}, FP, needs, reads[me])["c1"]
        for me in ("old", "new")
    }
    assert plans["new"].target == {0, 1, 2, 3} and plans["new"].waiting_for is None
    assert not plans["old"].target and plans["old"].release == {0, 1, 2, 3}
    steady = plan("old", [old, new], owners, {"c1": 4}, {"c1": S}, FP, {}, reads["old"])["c1"]
    assert steady.target == {0, 1, 2, 3}
