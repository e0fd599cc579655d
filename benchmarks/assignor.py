"""Time the sticky assignor at 10,000 units x 100 members against a round-robin baseline.

Run as ``python benchmarks/assignor.py``. For an initial assignment, a join and a leave it prints
the median time of the sticky assignor and of a naive sort-and-deal-round-robin assignment of
the same units measured in the same run, their ratio, and how many units each moved.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

try:
    from messaging.distribution._assignor import assign
except ModuleNotFoundError:  # running from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from messaging.distribution._assignor import assign

UNITS = [(f"consumer-{c:02d}", p) for c in range(50) for p in range(200)]
MEMBERS = [f"instance-{i:03d}" for i in range(100)]
RUNS = 15

Assignor = Callable[[Iterable[Any], Iterable[str], Mapping[Any, str | None]], dict[Any, str]]


def round_robin(
    units: Iterable[Any], members: Iterable[str], current: Mapping[Any, str | None]
) -> dict[Any, str]:
    """The non-sticky baseline: sorted units dealt round-robin over the sorted members."""
    live = sorted(set(members))
    if not live:
        return {}
    return {unit: live[i % len(live)] for i, unit in enumerate(sorted(set(units)))}


def median_ms(
    assignor: Assignor, members: list[str], current: Mapping[Any, str | None]
) -> tuple[float, dict[Any, str]]:
    """Median wall time of ``RUNS`` calls in milliseconds, and the answer."""
    timings = []
    for _ in range(RUNS):
        start = time.perf_counter()
        result = assignor(UNITS, members, current)
        timings.append((time.perf_counter() - start) * 1000)
    return statistics.median(timings), result


def moves(before: Mapping[Any, str | None], after: Mapping[Any, str], members: list[str]) -> int:
    """Units taken away from a live owner."""
    live = set(members)
    return sum(
        1 for unit, owner in after.items() if before.get(unit) in live and before[unit] != owner
    )


def changed(before: Mapping[Any, str | None], after: Mapping[Any, str]) -> int:
    """Units whose owner differs, including those of departed members."""
    return sum(1 for unit, owner in after.items() if before.get(unit, owner) != owner)


def report(
    label: str, members: list[str], current: dict[Any, str | None], rr_current: dict[Any, Any]
) -> tuple[dict[Any, str], dict[Any, str]]:
    """Time one scenario for both assignors and print one line; return both answers."""
    sticky_ms, sticky = median_ms(assign, members, current)
    rr_ms, rr = median_ms(round_robin, members, rr_current)
    print(
        f"{label} {len(UNITS)}x{len(members)}: {sticky_ms:.1f} ms "
        f"(baseline round-robin {rr_ms:.1f} ms, ratio {sticky_ms / rr_ms:.2f}); "
        f"moved {moves(current, sticky, members)} units "
        f"(round-robin moved {moves(rr_current, rr, members)}); "
        f"{changed(current, sticky)} changed owner "
        f"in all (round-robin {changed(rr_current, rr)})"
    )
    return sticky, rr


def main() -> None:
    initial, rr_initial = report("initial", MEMBERS, {}, {})
    joined = [*MEMBERS, "instance-new"]
    after_join, rr_join = report("join", joined, dict(initial), dict(rr_initial))
    left = [member for member in joined if member != "instance-050"]
    report("leave", left, dict(after_join), dict(rr_join))


if __name__ == "__main__":
    main()
