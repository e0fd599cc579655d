"""A MariaDB set read-only under an instance is an outage, not a flood: one WARNING per
loop naming the server, no traceback, ``ready`` 503 saying why, ``projections health``
degraded with the reason; once writes are allowed again, every message is applied."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import health_app
import pytest
from clusters import start_instance, stop_instance, wait_until, write_config
from private_mariadb import PrivateMariaDB, running_server

from messaging import Database
from messaging.store._migrations import migrate

pytestmark = [pytest.mark.mysql, pytest.mark.multiprocess]

READ_ONLY_FOR = 2.0
"""Seconds the server stays read-only: many polls and heartbeats of the instance."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    with running_server(tmp_path, "refusals") as private:
        private.execute("CREATE USER 'app'@'127.0.0.1'")  # no privilege past read_only
        private.execute("GRANT ALL ON refusals.* TO 'app'@'127.0.0.1'")
        yield private


def test_a_read_only_server_is_one_warning_per_loop_and_loses_nothing(
    server: PrivateMariaDB, tmp_path: Path
) -> None:
    root = Database(server.url("refusals"))  # root may write while the server is read-only
    migrate(root)
    root.prepare()
    app = Database(f"mysql+pymysql://app@127.0.0.1:{server.port}/refusals")
    timings = {
        "stale-instance-timeout": "20s",
        "conflict-retry": {"max-retries": 3, "max-delay": "100ms"},
    }
    config = write_config(tmp_path / "config.yaml", app, consumer=timings)
    app.dispose()
    port, log = health_app.free_port(), tmp_path / "p1.log"
    process = start_instance(
        config, "p1", "health_app", log=log, options=("--admin-port", str(port))
    )
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=60, what="ready")
    health_app.append(root, 0, 20)
    wait_until(
        lambda: health_app.applied(root) == 20, timeout=60, what="the first messages applied"
    )

    server.execute("SET GLOBAL read_only = 1")
    health_app.append(root, 20, 20)
    read_only = f"the server 127.0.0.1:{server.port} is read-only"
    health_app.wait_refused(config, port, read_only)
    time.sleep(READ_ONLY_FOR)  # the refusal itself: polls and heartbeats keep failing meanwhile
    assert health_app.applied(root) == 20

    server.execute("SET GLOBAL read_only = 0")
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=60, what="back")
    wait_until(lambda: health_app.applied(root) == 40, timeout=60, what="the backlog applied")
    assert stop_instance(process) == 0
    root.dispose()

    health_app.assert_quiet(log, read_only)
