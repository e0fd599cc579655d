"""A Kubernetes-style probe of an instance whose MariaDB goes away: ``ready`` answers 503
while the database is down and 200 once it is back; ``live`` stays 200 throughout (a
restart would not bring the database back). So does ``projections admin``, beside no
instance."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import ANY

import health_app
import pytest
from clusters import start_instance, stop_instance, wait_until, write_config
from private_mariadb import PrivateMariaDB, running_server

from messaging import Database
from messaging.store._migrations import migrate

pytestmark = [pytest.mark.mysql, pytest.mark.multiprocess]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    with running_server(tmp_path, "probes") as private:
        yield private


def _ready(ports: tuple[int, ...]) -> set[int]:
    """The statuses ``ready`` answers on ``ports``."""
    return {health_app.probe(port, "health/ready")[0] for port in ports}


def test_ready_is_503_while_the_database_is_down_and_live_stays_200(
    server: PrivateMariaDB, tmp_path: Path
) -> None:
    db = Database(server.url("probes"))
    migrate(db)
    db.prepare()
    timings = {
        "stale-instance-timeout": "20s",
        "conflict-retry": {"max-retries": 3, "max-delay": "100ms"},
    }
    config = write_config(tmp_path / "config.yaml", db, consumer=timings)
    db.dispose()
    port = health_app.free_port()
    process = start_instance(
        config,
        "p1",
        "health_app",
        env={"HEALTH_DIR": str(tmp_path)},
        log=tmp_path / "p1.log",
        options=("--admin-port", str(port)),
    )
    alone = health_app.free_port()  # an admin server beside no instance
    admin = subprocess.Popen(
        [sys.executable, "-m", "projections.cli", "admin", "--port", str(alone), "-c", str(config)],
        stdout=subprocess.DEVNULL,
    )
    ports = (port, alone)
    try:
        wait_until(lambda: _ready(ports) == {200}, timeout=60, what="both servers up")

        server.stop()
        answers: list[int] = []

        def unready() -> bool:
            answers.extend(health_app.probe(each, "health/live")[0] for each in ports)
            return all(
                health_app.probe(each, "health/ready")
                == (503, {"status": "fail", "reasons": ["the database is unreachable"], "by": ANY})
                for each in ports
            )

        wait_until(unready, timeout=30, what="ready to answer 503")
        for _ in range(10):  # live, asked again and again while the database stays down
            answers.extend(health_app.probe(each, "health/live")[0] for each in ports)
        assert set(answers) == {200}

        server.start()
        wait_until(lambda: _ready(ports) == {200}, timeout=60, what="the database back")
        assert stop_instance(process) == 0
    finally:
        assert stop_instance(admin) == 0
