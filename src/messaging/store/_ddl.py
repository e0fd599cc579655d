"""Schema changes that must not hold readers up: a bounded wait for metadata locks.

On MySQL/MariaDB a ``RENAME TABLE`` or ``DROP TABLE`` waits for every open transaction
that read the table (its metadata lock) for up to ``lock_wait_timeout``, a year by
default, and every statement on the table queues behind it meanwhile. The framework's
own DDL therefore waits at most :data:`DDL_LOCK_WAIT`, then fails (MySQL 1205) and is
tried again later. SQLite takes no such locks: the bound is a no-op there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection

from messaging.store._database import Database

DDL_LOCK_WAIT = 1
"""Seconds the framework's MySQL/MariaDB DDL waits for metadata locks (the server's
minimum): readers' statements on the tables queue behind a waiting statement."""


@contextmanager
def bounded_lock_wait(conn: Connection) -> Iterator[None]:
    """Within the block, DDL on ``conn`` (MySQL/MariaDB) waits at most
    :data:`DDL_LOCK_WAIT` for metadata locks; the session's own bound is restored after
    (the connection goes back to the pool)."""
    if conn.dialect.name == "sqlite":
        yield
        return
    kept = conn.exec_driver_sql("SELECT @@SESSION.lock_wait_timeout").scalar_one()
    conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {DDL_LOCK_WAIT}")
    try:
        yield
    finally:
        conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {int(kept)}")


def drop_tables_if_exist(db: Database, names: Iterable[str]) -> None:
    """Drop the tables ``names`` that exist, waiting at most :data:`DDL_LOCK_WAIT` for
    each one's readers."""
    quote = db.engine.dialect.identifier_preparer.quote
    with db.engine.connect() as conn, bounded_lock_wait(conn):
        for name in names:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {quote(name)}")
        conn.commit()
