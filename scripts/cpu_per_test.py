"""Where the suite's time goes: a pytest plugin that records each test's wall time, its
worker's CPU time and the CPU time of the child processes it reaped (instances, CLI
commands, Galera nodes), and a report of the biggest.

    PYTHONPATH=scripts python3 -m pytest -p cpu_per_test -n 2 -m "not alone"
    python3 scripts/cpu_per_test.py            # the report: the tests and files costing most

Records go to ``$CPU_PER_TEST`` (``/tmp/cpu_per_test.jsonl`` by default), one JSON line
per test, appended (remove the file before a new run). A process killed by a test
(SIGKILL) is reaped, and counted, wherever it is waited for. Commands the tests' fork
server starts (tests/support/forked.py) are its children, not the worker's: run with
``PROJECTIONS_TEST_SPAWN=exec`` to count their CPU too.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RECORDS = Path(os.environ.get("CPU_PER_TEST", "/tmp/cpu_per_test.jsonl"))


def _children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    wall, own, children = time.perf_counter(), time.process_time(), _children()
    yield
    record = {
        "test": item.nodeid,
        "wall": time.perf_counter() - wall,
        "self": time.process_time() - own,
        "children": _children() - children,
    }
    with RECORDS.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def report(path: Path, most: int = 30) -> str:
    """The totals, then the tests and the files that cost the most CPU."""
    rows: list[dict[str, Any]] = [json.loads(line) for line in path.read_text().splitlines()]
    cpu = {r["test"]: r["self"] + r["children"] for r in rows}
    by_file: Counter[str] = Counter()
    for test, seconds in cpu.items():
        by_file[test.split("::")[0]] += seconds
    lines = [
        f"{len(rows)} tests: wall {sum(r['wall'] for r in rows):.0f} s, worker CPU "
        f"{sum(r['self'] for r in rows):.0f} s, children's CPU "
        f"{sum(r['children'] for r in rows):.0f} s",
        "",
        *(f"{s:7.1f} s  {t}" for t, s in Counter(cpu).most_common(most)),
        "",
        *(f"{s:7.1f} s  {f}" for f, s in by_file.most_common(most)),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else RECORDS))
