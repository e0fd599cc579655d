"""Worked examples of the sticky assignor."""

from __future__ import annotations

from collections import Counter

from messaging.distribution._assignor import assign

ORDERS = [("orders", p) for p in range(8)]


def moved(before: dict, after: dict) -> dict:
    """Units whose owner changed, mapped to (old owner, new owner)."""
    return {unit: (before[unit], after[unit]) for unit in after if before.get(unit) != after[unit]}


def test_a_stable_balanced_assignment_is_kept() -> None:
    """Two members holding four partitions each keep exactly what they hold."""
    current = {unit: "A" if unit[1] < 4 else "B" for unit in ORDERS}
    assert assign(ORDERS, ["A", "B"], current) == current


def test_a_join_moves_two_of_eight_partitions_to_the_joiner() -> None:
    """With A and B holding four each, C joins: exactly two partitions move, both to C."""
    current = {unit: "A" if unit[1] < 4 else "B" for unit in ORDERS}
    after = assign(ORDERS, ["A", "B", "C"], current)
    assert moved(current, after) == {("orders", 3): ("A", "C"), ("orders", 7): ("B", "C")}
    assert Counter(after.values()) == {"A": 3, "B": 3, "C": 2}


def test_a_leave_moves_only_the_leavers_partitions() -> None:
    """From A:3, B:3, C:2, B leaves: only B's three partitions move, to A and C."""
    current = {unit: "A" if unit[1] < 3 else "B" if unit[1] < 6 else "C" for unit in ORDERS}
    after = assign(ORDERS, ["A", "C"], current)
    assert {unit for unit in moved(current, after)} == {u for u, o in current.items() if o == "B"}
    assert Counter(after.values()) == {"A": 4, "C": 4}


def test_units_of_departed_or_no_owner_are_placed_on_live_members() -> None:
    """Partitions owned by nobody or by a dead instance go to the members below their share."""
    current = {("orders", 0): "A", ("orders", 1): "dead", ("orders", 2): None}
    after = assign(ORDERS[:4], ["A", "B"], current)
    assert after == {
        ("orders", 0): "A",
        ("orders", 1): "A",
        ("orders", 2): "B",
        ("orders", 3): "B",
    }


def test_the_bigger_shares_go_to_the_biggest_holders() -> None:
    """When units do not divide evenly, the members already holding more keep the extra unit."""
    current = {"u1": "B", "u2": "B", "u3": "C", "u4": "C", "u5": "A"}
    after = assign(current, ["A", "B", "C"], current)
    assert after == current
    assert assign(current, ["A", "B", "C"], {}) == {
        "u1": "A",
        "u2": "A",
        "u3": "B",
        "u4": "B",
        "u5": "C",
    }


def test_whole_consumers_are_units_in_single_owner_mode() -> None:
    """Whole consumers are assigned like partitions; the current holder gets the bigger share."""
    consumers = [("billing",), ("mail",), ("orders",)]
    after = assign(consumers, ["i-2", "i-1"], {("mail",): "i-2"})
    assert after == {("billing",): "i-1", ("mail",): "i-2", ("orders",): "i-2"}


def test_no_members_means_no_assignment() -> None:
    """With no live members nothing can be assigned, and the answer is empty."""
    assert assign(ORDERS, [], {ORDERS[0]: "A"}) == {}


def test_no_units_means_an_empty_assignment() -> None:
    """With no units there is nothing to assign."""
    assert assign([], ["A", "B"], {}) == {}


def test_ten_thousand_units_over_a_hundred_members() -> None:
    """A 10,000 x 100 assignment, then a join, stays balanced and moves only to the joiner."""
    units = [(f"consumer-{c}", p) for c in range(100) for p in range(100)]
    members = [f"instance-{i:03d}" for i in range(100)]
    first = assign(units, members, {})
    assert set(Counter(first.values()).values()) == {100}
    after = assign(units, [*members, "instance-new"], first)
    changes = moved(first, after)
    assert len(changes) == 10_000 // 101
    assert {new for _, new in changes.values()} == {"instance-new"}
