"""``projections demo`` end to end: three instance processes, one SIGKILLed partway, a
replacement and a clean stop, the handover times printed and the read model verified."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

HANDOVERS = ("crash handover", "join handover", "clean-stop handover")


def test_demo_kills_replaces_stops_and_verifies(tmp_path: Path) -> None:
    """The demo exits 0, prints the three handover times and the OK line."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "projections.cli",
            "demo",
            "--messages",
            "4000",
            "--database",
            f"sqlite:///{tmp_path}/demo.db",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    assert re.search(
        r"^OK: read model equals a sequential replay of 4\d{3} ledger messages", output, re.M
    )
    assert re.search(r"^OK: \d+ transfer sagas ended as a sequential model says", output, re.M)
    for handover in HANDOVERS:
        assert re.search(rf"{handover}: \d+\.\d\ds ", output), f"no {handover} time:\n{output}"
    assert "SIGKILL demo-" in output
    assert "every instance exited with 0" in output
    assert "\r" not in output  # not a terminal: plain lines, no progress rewriting
