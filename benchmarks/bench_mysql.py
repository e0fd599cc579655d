"""MySQL helpers the benchmarks share: a scratch database, and the hand-written baselines'
raw PyMySQL connection."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pymysql
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from messaging import Database


@contextmanager
def scratch_database(url: str, purpose: str) -> Iterator[str]:
    """The URL of a database of its own beside ``url``'s, dropped afterwards (``url``'s own
    database if it may not create one). Fixed-name read-model tables, such as the ledger's,
    cannot be kept apart from other users of a shared database by a table prefix."""
    admin = Database(url)
    base = make_url(admin.url)
    name = f"{base.database or 'test'}_{purpose}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.engine.begin() as conn:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    except DBAPIError as exc:
        admin.dispose()
        print(f"(no scratch database: {exc.orig}; using {base.database})", file=sys.stderr)
        yield url
        return
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.engine.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


def connect(url: str) -> pymysql.Connection:
    """A PyMySQL connection to ``url`` at READ COMMITTED, transactions begun explicitly."""
    parsed = make_url(url)
    connection = pymysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        database=parsed.database,
        charset="utf8mb4",
        autocommit=False,
    )
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return connection
