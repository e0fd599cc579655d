"""CLI errors are one clear line on stderr with a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import forked
import pytest

from messaging import Database


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return forked.run(args, timeout=60)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_database_is_one_line_naming_the_database() -> None:
    """A refused connection exits 1 with a single 'database:' line naming the server's
    address, port included (the driver names the host alone), and the error's code."""
    port = _closed_port()
    result = _run("status", "--database", f"mysql://root@127.0.0.1:{port}/test")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("projections: error: database:")
    assert lines[0].endswith(f" at 127.0.0.1:{port} (MySQL error 2003)"), lines[0]
    assert "Traceback" not in result.stderr


def test_an_unknown_log_level_is_refused() -> None:
    """--log-level takes only the logging levels, and says which."""
    result = _run("--log-level", "nonsense", "status")
    assert result.returncode == 2
    assert "invalid choice: 'NONSENSE'" in result.stderr


def _one_line(result: subprocess.CompletedProcess[str], *expected: str, code: int = 1) -> None:
    """A non-zero exit, one line on stderr holding each expected part, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for part in expected:
        assert part in lines[0], lines[0]


def _in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run(args, timeout=60, cwd=folder)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_an_admin_port_in_use_is_one_line(tmp_path: Path, busy_port: int) -> None:
    """`admin --port` and `run --admin-port` on a port in use say so in one line (`run`
    before it makes the database)."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    _one_line(_in(tmp_path, "admin", "--port", str(busy_port), "--database", url), "in use")
    (tmp_path / "app.db").unlink(missing_ok=True)
    run = ("run", "projections.examples.ledger", "--database", url)
    _one_line(_in(tmp_path, *run, "--admin-port", str(busy_port)), "in use")
    assert not (tmp_path / "app.db").exists()  # refused before the database was made


@pytest.mark.parametrize("url", ["mysql://root@127.0.0.1:3306/", "mysql://root@127.0.0.1:3306"])
def test_a_mysql_url_without_a_database_says_so(tmp_path: Path, url: str) -> None:
    """Not an assertion error from deep inside: the URL, and what to add."""
    _one_line(
        _in(tmp_path, "status", "--database", url),
        f"invalid database URL {url!r}: it names no database (schema)",
        "mysql://user@host:3306/app",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("admin", "--port", "70000"), "argument --port: must be from 0 to 65535, got 70000"),
        (
            ("run", "app", "--admin-port", "-1"),
            "argument --admin-port: must be from 0 to 65535, got -1",
        ),
        (("append", "--batch-size", "0"), "argument --batch-size: must be 1 or more, got 0"),
        (("run", "app", "--workers", "0"), "argument --workers: must be 1 or more, got 0"),
        (("demo", "--workers", "1"), "argument --workers: must be 2 or more, got 1"),
        (("demo", "--messages", "many"), "argument --messages: expected a whole number"),
    ],
)
def test_numeric_options_are_range_checked(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    """Out-of-range numbers are refused before anything runs, in one usage line (exit 2)."""
    _one_line(_in(tmp_path, *args), expected, code=2)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://root@127.0.0.1:99999/test", "the port must be a number 1-65535"),
        ("mysql://root@127.0.0.1:port/test", "the port must be a number 1-65535"),
        ("/tmp/app.db", "expected a URL such as sqlite:///path/to/app.db"),
    ],
)
def test_a_bad_database_url_is_one_line(tmp_path: Path, url: str, expected: str) -> None:
    """A URL with a bad port, or a path instead of a URL, in `status` and `demo`."""
    _one_line(_in(tmp_path, "status", "--database", url), f"invalid database URL {url!r}")
    _one_line(_in(tmp_path, "demo", "--database", url), f"invalid database URL {url!r}", expected)


def test_non_utf8_append_input_is_one_line(tmp_path: Path) -> None:
    """A line that is not UTF-8 is named; the batches before it stay appended."""
    good = '{"topic": "t", "source": "s", "type": "x", "payload": {}}\n'
    (tmp_path / "in.jsonl").write_bytes(good.encode() * 3 + b"\xff\xfe\n")
    url = f"sqlite:///{tmp_path / 'app.db'}"
    result = _in(tmp_path, "append", "in.jsonl", "--batch-size", "2", "--database", url)
    _one_line(result, "line 4: not UTF-8 text", "2 earlier lines were appended")


@pytest.mark.parametrize("command", ["status", "instances", "audit", "pause"])
def test_reporting_commands_never_create_a_database(tmp_path: Path, command: str) -> None:
    """In a folder with no database, the commands name the missing file and create none."""
    args = (command, "ledger-balances") if command == "pause" else (command,)
    _one_line(_in(tmp_path, *args), f"no database at {tmp_path / 'projections.db'}")
    assert list(tmp_path.iterdir()) == []


def test_traceback_still_shows_everything(tmp_path: Path) -> None:
    """--traceback shows the whole story of the same error."""
    result = _in(tmp_path, "--traceback", "status")
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "no database at" in result.stderr


@pytest.mark.parametrize(
    ("args", "buffered"),
    [
        (("status",), True),
        (("status", "--json"), False),
        (("instances",), True),
        (("audit",), False),
    ],
)
def test_a_reader_that_closes_early_ends_the_command_quietly(
    tmp_path: Path, args: tuple[str, ...], buffered: bool
) -> None:
    """`projections status | head`, the reader gone first: a real `head -n 0` exits
    without reading, then the command writes into its pipe. It exits 141 (as SIGPIPE would
    end it) with nothing on stderr, whether its stdout is buffered (the broken pipe shows
    at the last flush) or not (at the first line)."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    db = Database(url)
    db.prepare()
    db.dispose()
    read, write = os.pipe()
    head = subprocess.Popen(["head", "-n", "0"], stdin=read)
    os.close(read)
    assert head.wait(timeout=30) == 0  # nothing reads the pipe any more
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "projections.cli", *args, "--database", url],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")
