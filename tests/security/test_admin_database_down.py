"""The database stops under a running admin server (a MariaDB of the test's own): every
route answers 503 with a fixed line, never the driver's text, and the server recovers
when the database is back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_client import TOKEN, get_json, post, serve
from clusters import wait_until
from private_mariadb import PrivateMariaDB

from messaging import Database
from messaging._config import settings_from_mapping
from messaging.store._migrations import migrate
from projections._admin import DATABASE_UNAVAILABLE, make_server

pytestmark = pytest.mark.multiprocess

ROUTES = ("/admin/consumers", "/admin/instances", "/admin/cluster")


@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    server = PrivateMariaDB(tmp_path / "mariadb")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_stopped_database_answers_503_and_recovers(
    mariadb: PrivateMariaDB, caplog: pytest.LogCaptureFixture
) -> None:
    mariadb.execute("CREATE DATABASE admin_down")
    db = Database(mariadb.url("admin_down"))
    migrate(db)
    db.prepare()
    settings = settings_from_mapping({"admin": {"token": TOKEN}})
    server = make_server(db, settings, "127.0.0.1", 0)
    base, thread = serve(server)
    try:
        for route in ROUTES:
            assert get_json(base + route)[0] == 200

        mariadb.stop()
        answers = [get_json(base + route) for route in ROUTES]
        answers.append(post(f"{base}/admin/consumers/anything/pause", {}, token=TOKEN))
        for status, body in answers:
            assert (status, body) == (503, {"error": DATABASE_UNAVAILABLE})
        shown = json.dumps(answers)
        for text in ("2003", "Can't connect", "pymysql", "127.0.0.1"):
            assert text not in shown
        assert any("Can't connect" in r.getMessage() for r in caplog.records), "logged"

        mariadb.start()
        wait_until(
            lambda: all(get_json(base + route)[0] == 200 for route in ROUTES),
            timeout=30,
            what="the admin server to answer again",
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        db.dispose()


def test_a_pool_with_no_connection_free_answers_503(tmp_path: Path) -> None:
    """Every pooled connection busy (the pool's wait for one runs out): 503 with the fixed
    line, as for a database that is down, not a 500."""
    db = Database(f"sqlite:///{tmp_path / 'busy.db'}")
    db.prepare()
    pool: Any = db.engine.pool
    pool._timeout = 0.2  # the wait for a free connection, 30 s by default
    server = make_server(db, settings_from_mapping({}), "127.0.0.1", 0)
    base, thread = serve(server)
    held = [db.engine.connect() for _ in range(pool.size() + pool._max_overflow)]
    try:
        for route in ROUTES:
            assert get_json(base + route) == (503, {"error": DATABASE_UNAVAILABLE})
    finally:
        for connection in held:
            connection.close()
        try:
            assert get_json(base + ROUTES[0])[0] == 200
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
            db.dispose()
