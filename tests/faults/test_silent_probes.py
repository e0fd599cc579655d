"""A database that goes silent (a TCP proxy frozen: nothing passes, nothing is reset)
under an instance with its admin server and under ``projections admin`` alone: the probes
and ``/metrics`` answer from memory in under a second throughout, ``ready`` turns 503
within the answer bound and 200 again once the database answers, and ``projections
health`` ends within its bound saying the database did not answer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusters import owned_by, start_instance, stop_instance, wait_until, write_config
from health_app import free_port
from silent_proxy import SilentProxy

from messaging import Database

pytestmark = [pytest.mark.faults, pytest.mark.mysql, pytest.mark.multiprocess]

STALE = 8.0
"""stale-instance-timeout: lock waits give up after 2 s, answers after 4 s."""
SILENT_AFTER = 2.0
"""The lock-wait bound: a wait past it is a database that does not answer."""
ANSWER_BOUND = 4.0
QUICK = 1.0
"""Seconds a probe or a scrape may take, whatever the database does."""


def _get(port: int, path: str) -> tuple[int, float, bytes]:
    """(status, seconds taken, body) of ``GET path`` on ``port``."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
            body, status = answer.read(), answer.status
    except urllib.error.HTTPError as error:
        body, status = error.read(), error.code
    return status, time.monotonic() - started, body


def _ready(port: int) -> bool:
    """Whether ``ready`` answers 200 (False while nothing listens on ``port`` yet)."""
    try:
        return _get(port, "/admin/health/ready")[0] == 200
    except urllib.error.URLError:
        return False


def _silent_since(body: bytes) -> float | None:
    """How long ago, by the server's own reason, ``ready`` turned 503 for a silent
    database (it says how long the database has not answered: 503 from the lock-wait
    bound on)."""
    for reason in json.loads(body)["reasons"]:
        found = re.search(r"has not answered (?:a heartbeat )?for ([\d.]+) s", reason)
        if found:
            return float(found.group(1)) - SILENT_AFTER
    return None


@pytest.fixture
def proxied_config(db: Database, silent: SilentProxy, tmp_path: Path) -> Iterator[Path]:
    proxied_db = Database(silent.url(db.url), table_prefix=db.schema.prefix)
    timings = {"stale-instance-timeout": f"{STALE}s", "heartbeat-interval": "500ms"}
    extra = "plugins: [projections_otel]\n"
    yield write_config(tmp_path / "proxied.yaml", proxied_db, consumer=timings, extra=extra)
    proxied_db.dispose()


def test_probes_and_metrics_answer_at_once_while_the_database_is_silent(
    db: Database, silent: SilentProxy, proxied_config: Path, tmp_path: Path
) -> None:
    instance_port, admin_port = free_port(), free_port()
    instance = start_instance(
        proxied_config,
        "silenced",
        log=tmp_path / "instance.log",
        options=("--admin-port", str(instance_port)),
    )
    command = ["admin", "--config", str(proxied_config), "--port", str(admin_port)]
    admin = subprocess.Popen(
        [sys.executable, "-m", "projections.cli", *command],
        stderr=(tmp_path / "admin.log").open("wb"),
    )
    ports = {"instance": instance_port, "admin": admin_port}
    try:
        wait_until(lambda: owned_by(db, {"silenced"}), timeout=60, what="the instance to own")
        for port in ports.values():
            wait_until(lambda port=port: _ready(port), timeout=60, what="ready")  # type: ignore[misc]
        silent.freeze()
        frozen_at = time.monotonic()
        health = subprocess.Popen(
            [sys.executable, "-m", "projections.cli", "health", "--config", str(proxied_config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        unready: dict[str, float] = {}
        slowest = dict.fromkeys(ports, 0.0)
        while time.monotonic() - frozen_at < ANSWER_BOUND + 2:
            for who, port in ports.items():
                for path in ("/admin/health/live", "/metrics"):
                    slowest[who] = max(slowest[who], _get(port, path)[1])
                status, took, body = _get(port, "/admin/health/ready")
                slowest[who] = max(slowest[who], took)
                since = _silent_since(body) if status == 503 else None
                if since is not None:  # when it turned, not when this loop looked
                    unready.setdefault(who, time.monotonic() - since - frozen_at)
            time.sleep(0.1)
        out, err = health.communicate(timeout=60)
        health_took = time.monotonic() - frozen_at
        silent.thaw()
        for port in ports.values():
            wait_until(
                lambda port=port: _ready(port),  # type: ignore[misc]
                timeout=STALE + 30,
                what="ready again once the database answers",
            )
    finally:
        silent.thaw()
        admin.terminate()
        admin.wait(timeout=30)
        codes = [stop_instance(instance)]
    print(
        f"\nslowest answers {slowest}; 503 after {unready}; health ended after {health_took:.1f} s"
    )
    assert max(slowest.values()) < QUICK, slowest
    assert set(unready) == set(ports) and max(unready.values()) <= ANSWER_BOUND, unready
    assert health.returncode == 3, (out, err)
    assert "did not answer prepare within" in err and "may have committed" not in err, err
    assert health_took <= ANSWER_BOUND + 3, health_took  # its bound, and a process's start
    assert codes == [0]
