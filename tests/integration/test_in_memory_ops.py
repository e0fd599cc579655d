"""In-memory projections are first-class consumers of the instance that runs them: each
copy's state, position and lag are in `status`, and operating one instance's copy through
its admin endpoint leaves the other instance's copy untouched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_client import chromium, post
from clusters import SUPPORT, stop_instance, wait_until, write_config
from memory_app import CONSUMER, TOPIC, Item

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from projections._reports import consumers_report

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "projections.cli"]
ADMIN = ["--admin-port", "0", "--instance-name"]
TOKEN = "in-memory-test-admin-token"


def _start(config: Path, name: str) -> tuple[subprocess.Popen[str], str]:
    """A `projections run` process serving its admin endpoints; its base URL."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [
            *CLI,
            "--log-level",
            "WARNING",
            "run",
            "memory_app",
            "--config",
            str(config),
            *ADMIN,
            name,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("admin page: "), line
    return process, line.split()[-1].removesuffix("/admin")


def _post(base: str, command: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/admin/consumers/{CONSUMER}/{command}",
        data=json.dumps(body or {}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        return dict(json.loads(response.read()))


def _copies(db: Database) -> dict[str, dict[str, Any]]:
    """Each instance's copy of the in-memory consumer as `status --json` reports it."""
    for entry in consumers_report(db, ConsumerSettings())["in_memory"]:
        if entry["name"] == CONSUMER:
            assert entry["kind"] == "in-memory"
            return {copy["instance"]: copy for copy in entry["instances"]}
    return {}


@pytest.fixture
def two(db: Database, tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """Two instances running the in-memory consumer; their config and admin URLs."""
    config = write_config(tmp_path / "app.yaml", db, extra=f"admin: {{token: {TOKEN}}}\n")
    a, url_a = _start(config, "a")
    b, url_b = _start(config, "b")
    try:
        yield config, url_a, url_b
    finally:
        for process in (a, b):
            assert stop_instance(process) == 0


def _append(db: Database, *names: str) -> int:
    with db.transaction() as conn:
        MessageStore(db).append(conn, TOPIC, "s", [Item(n) for n in names])
    with db.read() as conn:
        return MessageStore(db).head(conn)


def test_each_instance_copy_is_reported_and_operated_alone(
    db: Database, two: tuple[Path, str, str]
) -> None:
    """Both copies halt at the poison message (shown with where it failed); the CLI points
    at the admin endpoints; resuming, pausing and rebuilding `a` leave `b` halted."""
    config, url_a, url_b = two
    _append(db, "one", "two")
    poison = _append(db, "poison")
    head = _append(db, "three", "four")

    def both_halted() -> dict[str, dict[str, Any]]:
        copies = _copies(db)
        return copies if [c["state"] for c in copies.values()] == ["halted"] * 2 else {}

    copies = wait_until(both_halted, timeout=60, what="both copies halted")
    for copy in copies.values():
        assert copy["position"] == poison - 1 and copy["lag"] == 3
        assert copy["halted"]["position"] == poison
        assert "cannot count poison" in copy["halted"]["error"]
        assert 'raise ValueError("cannot count poison")' in copy["halted"]["trace"]
    assert {copies["a"]["admin"], copies["b"]["admin"]} == {url_a, url_b}

    cli = subprocess.run(
        [*CLI, "resume", CONSUMER, "--skip-poison", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 1
    [line] = cli.stderr.strip().splitlines()
    assert "is an in-memory projection" in line and "unknown consumer" not in line
    assert f"a: POST {url_a}/admin/consumers/{CONSUMER}/resume" in line
    assert f"b: POST {url_b}/admin/consumers/{CONSUMER}/resume" in line

    text = subprocess.run(
        [*CLI, "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"{CONSUMER}  (in-memory, each instance runs its own copy)" in text

    assert _post(url_a, "resume", {"skip_poison": True})["halted"][0]["position"] == poison
    wait_until(
        lambda: _copies(db)["a"]["position"] == head and _copies(db)["a"]["lag"] == 0,
        timeout=30,
        what="a past the poison message",
    )
    assert _copies(db)["b"]["state"] == "halted"

    _post(url_a, "pause")
    newest = _append(db, "five")
    wait_until(lambda: _copies(db)["a"]["state"] == "paused", timeout=30, what="a paused")
    _post(url_a, "rebuild")
    a = wait_until(
        lambda: (c := _copies(db)["a"])["position"] == 0 and c, timeout=30, what="a rebuilt"
    )
    assert a["state"] == "paused" and a["lag"] == 6
    _post(url_a, "resume")
    wait_until(lambda: _copies(db)["a"]["state"] == "halted", timeout=30, what="a halted again")
    b = _copies(db)["b"]
    assert (b["state"], b["position"], b["lag"]) == ("halted", poison - 1, 4)
    assert newest == head + 1


def test_each_instance_page_shows_every_copy_and_operates_its_own(
    db: Database, two: tuple[Path, str, str], tmp_path: Path
) -> None:
    """Rendered by headless Chromium, `a`'s page lists both copies, halted at the poison
    message with its type, error and trace; the buttons are on `a`'s copy only, `b`'s row
    links to `b`'s page."""
    _, url_a, url_b = two
    _append(db, "one")
    poison = _append(db, "poison")
    wait_until(
        lambda: [c["state"] for c in _copies(db).values()] == ["halted"] * 2,
        timeout=60,
        what="both copies halted",
    )
    dom = chromium(tmp_path / "profile", "--dump-dom", url=url_a + "/admin")
    assert dom.returncode == 0, dom.stderr
    rows = dict(
        re.findall(
            r'<tr data-in-memory="test-memory" data-copy-of="(\w+)"(.*?)</tr>', dom.stdout, re.S
        )
    )
    assert set(rows) == {"a", "b"}
    for row in rows.values():
        assert f"halted at {poison} (test.memory.item): ValueError: cannot count poison" in row
        assert 'raise ValueError("cannot count poison")</pre>' not in row  # not the last line
        assert (
            'raise ValueError("cannot count poison")\nValueError: cannot count poison</pre>' in row
        )
    assert 'data-command="resume"' in rows["a"] and "skip poison" in rows["a"]
    assert "data-command" not in rows["b"]
    assert f'<a href="{url_b}/admin">its page</a>' in rows["b"]


def test_with_workers_each_worker_serves_its_own_copies(db: Database, tmp_path: Path) -> None:
    """`run --workers 2 --admin-port 0`: each worker publishes an admin URL of its own, and
    pausing the copy through one worker's URL leaves the other worker's copy running; the
    supervisor's own admin server, which runs no copy, points at the workers' endpoints."""
    config = write_config(tmp_path / "app.yaml", db, extra=f"admin: {{token: {TOKEN}}}\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
    command = [*CLI, "--log-level", "WARNING", "run", "memory_app", "--config", str(config)]
    supervisor = subprocess.Popen(
        [*command, "--workers", "2", "--admin-port", "0", "--instance-name", "w"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert supervisor.stdout is not None
        line = supervisor.stdout.readline()  # the supervisor's, bound before any worker
        assert line.startswith("admin page: "), line
        own = line.split()[-1].removesuffix("/admin")
        _append(db, "one")

        def published() -> dict[str, dict[str, Any]] | None:
            copies = _copies(db)
            return copies if len(copies) == 2 and all(c["admin"] for c in copies.values()) else None

        copies = wait_until(
            published, timeout=60, what="both workers' copies published with their admin URLs"
        )
        assert set(copies) == {"w-1", "w-2"}
        assert copies["w-1"]["admin"] != copies["w-2"]["admin"]
        status, answer = post(f"{own}/admin/consumers/{CONSUMER}/pause", {}, token=TOKEN)
        assert status == 409
        assert "is an in-memory projection" in answer["error"]
        for name in ("w-1", "w-2"):
            where = f"{name}: POST {copies[name]['admin']}/admin/consumers/{CONSUMER}/pause"
            assert where in answer["error"]
        _post(copies["w-1"]["admin"], "pause")
        wait_until(lambda: _copies(db)["w-1"]["state"] == "paused", timeout=30, what="w-1 paused")
        head = _append(db, "two")
        wait_until(
            lambda: _copies(db)["w-2"]["position"] == head, timeout=30, what="w-2 still applying"
        )
        assert _copies(db)["w-2"]["state"] == "running"
        assert _copies(db)["w-1"]["state"] == "paused"
    finally:
        assert stop_instance(supervisor) == 0
