"""CLI errors are one clear line on stderr with a non-zero exit, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections.cli", *args], capture_output=True, text=True, timeout=60
    )


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_database_is_one_line_naming_the_database() -> None:
    """A refused connection exits 1 with a single 'database:' line."""
    result = _run("status", "--database", f"mysql://root@127.0.0.1:{_closed_port()}/test")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("projections: error: database:")
    assert "Traceback" not in result.stderr


def test_an_unknown_log_level_is_refused() -> None:
    """--log-level takes only the logging levels, and says which."""
    result = _run("--log-level", "nonsense", "status")
    assert result.returncode == 2
    assert "invalid choice: 'NONSENSE'" in result.stderr
