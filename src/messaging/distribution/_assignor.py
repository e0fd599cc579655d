"""The sticky assignor: a balanced assignment of units to members that moves the fewest units.

A *unit* is a partition ``(consumer, partition)`` or, in single-owner mode, a whole consumer.
:func:`assign` is pure and deterministic: every instance that reads the same rows computes the
same answer, whatever order the rows came in.

Algorithm. With ``n`` units and ``m`` members every member gets a *quota* of ``q = n // m``
units, and the ``r = n % m`` members that currently hold the most units get ``q + 1``; ties
go round the sorted members starting at position ``rotation`` (mod ``m``). Each member keeps
its lowest-sorted units up to its quota; the surplus, together with the units that are
unowned or owned by a member that is no longer live, goes into a pool that is handed out in
sorted order to the members below quota, in member id order.

Why it is optimal. A balanced assignment gives every member ``q`` or ``q + 1`` units, so a live
member holding ``h`` units must lose at least ``max(0, h - quota)`` of them. Giving an extra slot
to a member lowers that bound by one only if it holds more than ``q``, so handing the ``r`` extra
slots to the largest holders minimises the sum of the bounds; the algorithm moves exactly that
many units, because only surplus units move. It follows that a join moves units only to the
joiner and a leave moves only the leaver's units. The rotation only orders members holding
equally many units, so any rotation is optimal.

Spreading remainders. With every consumer assigned on its own and ties broken by member id, the
remainders of many consumers would all land on the lowest ids (10 consumers of 8 partitions
over 3 instances: 30 / 30 / 20, for ever). The rebalance planner therefore gives the ``k``-th
consumer (in name order) the rotation ``k * r``: on a fresh start the extra slots go round the
members in turn across consumers, so consumers with equal counts spread their remainders
exactly (27 / 27 / 26). Joins and leaves are unaffected: holdings, not the rotation, decide
who keeps its extra slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

__all__ = ["assign"]


class _UnitId(Protocol):
    """A unit id: hashable and totally ordered among its peers (tuples, strings, ints)."""

    def __hash__(self) -> int: ...

    def __lt__(self, other: Any, /) -> bool: ...


U = TypeVar("U", bound=_UnitId)


def assign(
    units: Iterable[U],
    members: Iterable[str],
    current: Mapping[U, str | None],
    *,
    rotation: int = 0,
) -> dict[U, str]:
    """Assign every unit to exactly one member, balanced and with the fewest moves.

    ``current`` maps units to their present owner; units missing from it, owned by ``None`` or
    by a member not in ``members`` are unowned and placed without counting as a move. Entries of
    ``current`` for units not in ``units`` are ignored, and duplicates in ``units`` or
    ``members`` count once. The result maps each unit to a member; it is ``{}`` when
    ``members`` is empty. The order in which the arguments iterate does not affect the result.
    ``rotation`` picks which of the members holding equally many units get the extra slots:
    they go round the sorted members starting at that position.
    """
    live = sorted(set(members))
    if not live:
        return {}
    ordered = sorted(set(units))

    held: dict[str, list[U]] = {member: [] for member in live}
    pool: list[U] = []
    for unit in ordered:
        owner = current.get(unit)
        if owner is not None and owner in held:
            held[owner].append(unit)  # stays sorted: ``ordered`` is sorted
        else:
            pool.append(unit)

    base, extra = divmod(len(ordered), len(live))
    start = rotation % len(live)
    turn = {member: (index - start) % len(live) for index, member in enumerate(live)}
    by_holding = sorted(live, key=lambda member: (-len(held[member]), turn[member]))
    quota = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(by_holding)}

    result: dict[U, str] = {}
    for member in live:
        kept = held[member][: quota[member]]
        pool.extend(held[member][quota[member] :])
        for unit in kept:
            result[unit] = member
    pool.sort()

    handed = 0
    for member in live:
        need = quota[member] - len(held[member])
        if need > 0:
            for unit in pool[handed : handed + need]:
                result[unit] = member
            handed += need
    return result
