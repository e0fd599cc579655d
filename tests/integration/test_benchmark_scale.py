"""``benchmarks/scale.py`` runs end to end at a tiny size on each backend, prints every
figure it promises, and leaves no instance process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.multiprocess

FIGURES = {
    "waiting": r"2 instance\(s\): +([\d,]+) msg/s +ratio to linear ([\d.]+)",
    "cpu": r"CPU per message, 2 workers / 1 worker: ([\d.]+)",
    "many": r"statements/s per instance, 3 / 2 instances: ([\d.]+)",
    "join": r"join +1 +([\d.]+)s",
    "clean stop": r"clean stop +1 +([\d.]+)s",
    "load": r"load average ([\d.]+) -> ([\d.]+) on \d+ cores",
}


def _leftovers(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (the benchmark's scratch directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_scale_benchmark_runs_quick(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    where = []
    if backend == "mysql":
        where = ["--no-sqlite", "--mysql-url", request.getfixturevalue("mysql_database_url")]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its scratch directory, in the configs
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--quick", *where],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = {}
    for figure, pattern in FIGURES.items():
        found = re.search(pattern, done.stdout)
        assert found, f"no {figure} figure in:\n{done.stdout}"
        figures[figure] = [float(v.replace(",", "")) for v in found.groups()]
    assert figures["waiting"][0] > 0  # two instances applied the calls
    assert figures["many"][0] > 0  # the idle instances counted their statements
    assert _leftovers(str(tmp_path)) == []
