"""Helpers for tests of the admin server: serve it in a thread, fetch its routes, and
render its page in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import HTTPServer
from pathlib import Path
from typing import Any

import attrs

from messaging import AdminSettings, Database, Settings
from projections._admin import make_server
from projections._admin_http import BoundedHTTPServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: The admin token of the tests' servers.
TOKEN = "test-admin-token-0123456789"
#: The config lines that set it.
TOKEN_CONFIG = f"admin:\n  token: {TOKEN}\n"
#: Settings with it: commands need it; reads, waits and streams still need none.
TOKEN_SETTINGS = attrs.evolve(Settings(), admin=AdminSettings(token=TOKEN))


def get(url: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def get_json(url: str) -> tuple[int, Any]:
    """(status, decoded body) of a GET that must answer JSON."""
    status, content_type, body = get(url)
    assert content_type == "application/json"
    return status, json.loads(body)


def post(url: str, body: Any, *, token: str | None = TOKEN) -> tuple[int, Any]:
    """(status, decoded JSON answer) of a command POSTed as JSON, with ``token`` if given."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def serve(server: HTTPServer) -> tuple[str, threading.Thread]:
    """Serve ``server`` in a thread; return its base URL and the thread."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}", thread


@contextmanager
def served_admin(
    db: Database, *, max_threads: int, port: int = 0
) -> Iterator[tuple[str, BoundedHTTPServer]]:
    """An admin server of ``db`` (:data:`TOKEN_SETTINGS`) on ``127.0.0.1:port`` (0: a free
    one), served in a thread: its base URL and the server. On exit it stops and closes,
    cutting its open connections."""
    server = make_server(db, TOKEN_SETTINGS, "127.0.0.1", port, max_threads=max_threads)
    url, thread = serve(server)
    try:
        yield url, server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def admin_process(
    *arguments: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run ``projections ARGUMENTS...`` (which serves the admin page) with ``env`` added
    to the environment; yield the process and the base URL it printed. On exit it is sent
    SIGTERM and must stop cleanly (exit 0)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "projections.cli", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        assert line.startswith("admin page: http://"), (line, process.stderr.read())
        yield process, line.split(": ", 1)[1].strip().removesuffix("/admin")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def chromium(profile: Path, *options: str, url: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on ``url`` with ``options`` (``--dump-dom``, ``--screenshot``),
    letting the page's scripts run for up to 5 s of virtual time."""
    assert CHROMIUM is not None, "chromium is needed: apt-get install -y chromium"
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            *options,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def screenshot(tmp_path: Path, url: str, *, height: int = 900, suffix: str = "") -> Path:
    """A screenshot of ``url`` 1200 pixels wide, by headless Chromium (checked not blank);
    copied to ``$PROJECTIONS_ADMIN_SCREENSHOT`` (``suffix`` before ``.png``) when set, to
    look at it."""
    shot = tmp_path / "admin.png"
    profile = tmp_path / "profile-shot"
    result = chromium(profile, f"--screenshot={shot}", f"--window-size=1200,{height}", url=url)
    assert result.returncode == 0, result.stderr
    assert shot.exists()
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("PROJECTIONS_ADMIN_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep.removesuffix(".png") + suffix + ".png" if suffix else keep)
    return shot
