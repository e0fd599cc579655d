"""Shared fixtures: a real database per test, on SQLite and on MySQL/MariaDB.

MySQL tests find their server through ``PROJECTIONS_TEST_MYSQL_URL``. When it is set,
an unreachable server fails the tests (never a skip); ``.ci/run`` always sets it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdp import Browser
from effort import register_profiles
from forked import SPAWN_ENV
from silent_proxy import SilentProxy
from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.engine import make_url

from messaging import Database
from messaging.store._migrations import migrate
from projections.testing.database import drop_tables

# Loaded here too for runs whose installed metadata predates the pytest11 entry point.
pytest_plugins = ["projections.testing.plugin", "pytester"]

MYSQL_URL_ENV = "PROJECTIONS_TEST_MYSQL_URL"

# PROJECTIONS_TEST_EFFORT: dev, ci (the default) or nightly (tests/support/effort.py)
register_profiles()
# `projections` commands started by the tests' helpers are forked from a server that
# imported the framework once (tests/support/forked.py); `exec` starts each afresh.
os.environ.setdefault(SPAWN_ENV, "fork")


def mysql_url() -> str:
    """The test server's URL; skips only when the variable is unset (local runs)."""
    url = os.environ.get(MYSQL_URL_ENV)
    if not url:
        pytest.skip(f"{MYSQL_URL_ENV} is not set")
    try:
        engine = create_engine(
            url if "+" in url.split("://")[0] else url.replace("://", "+pymysql://", 1)
        )
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # the server must be there when the variable says so
        pytest.fail(f"{MYSQL_URL_ENV}={url} is set but the server cannot be reached: {exc}")
    return url


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def backend(request: pytest.FixtureRequest) -> str:
    """Each test that uses it runs once per backend."""
    return str(request.param)


@pytest.fixture(scope="session")
def mysql_database_url() -> Iterator[str]:
    """A MySQL database of this test session's own, so that nothing else using the server
    (another run, a benchmark) can see or drop our tables; dropped at the end."""
    url = make_url(_with_driver(mysql_url()))
    name = f"prj_test_{uuid.uuid4().hex[:10]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()


def _with_driver(url: str) -> str:
    return url if "+" in url.split("://")[0] else url.replace("://", "+pymysql://", 1)


@pytest.fixture
def database_url(backend: str, tmp_path: os.PathLike[str], request: pytest.FixtureRequest) -> str:
    """A fresh database URL for this test on the chosen backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/test.db"
    return str(request.getfixturevalue("mysql_database_url"))


@pytest.fixture
def projections_database_url(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The testing kit's clusters, on each backend: its own temporary SQLite file, or this
    session's MySQL database."""
    return None if backend == "sqlite" else str(request.getfixturevalue("mysql_database_url"))


@pytest.fixture
def table_prefix(backend: str) -> str:
    """A table prefix unique to this test, so MySQL tests never see each other's rows."""
    return "prj_" if backend == "sqlite" else f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    """Read-model metadata whose tables a test creates; dropped after MySQL tests."""
    from projections.examples import ledger

    return [ledger.metadata]


@pytest.fixture
def db(
    database_url: str, table_prefix: str, read_model_metadata: list[MetaData]
) -> Iterator[Database]:
    """A prepared database (schema created on SQLite, migrated on MySQL)."""
    database = Database(database_url, table_prefix=table_prefix)
    if not database.is_sqlite:
        drop_tables(database, [t for m in read_model_metadata for t in m.tables])
        migrate(database)
    database.prepare()
    yield database
    if not database.is_sqlite:
        drop_tables(database, [t for m in read_model_metadata for t in m.tables])
    database.dispose()


@pytest.fixture
def silent(db: Database) -> Iterator[SilentProxy]:
    """A proxy in front of the test's MySQL server whose network can die without a word."""
    url = make_url(db.url)
    proxy = SilentProxy((url.host or "127.0.0.1", url.port or 3306))
    yield proxy
    proxy.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A headless Chromium of this test's own, driven over the DevTools protocol."""
    browser = Browser(tmp_path / "profile")
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """Instance processes a failing test left running are killed when it ends."""
    yield
    from clusters import kill_leftovers

    kill_leftovers()
