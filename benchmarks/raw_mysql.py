"""The hand-written baselines' MySQL connection: raw PyMySQL, as an application would open it."""

from __future__ import annotations

import pymysql  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url


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
