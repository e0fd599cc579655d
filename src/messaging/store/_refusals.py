"""A database that refuses writes (a full disk, a failing one, a read-only file or server),
told apart from other errors and put in words a user acts on; and whether it answers.

Such a database is an outage like an unreachable one (:mod:`messaging.applying._outage`):
nothing a handler wrote is wrong, and retrying once space is freed or writes are allowed
again goes on where it stopped. A batch that meets it is never taken for a poison message.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from sqlalchemy import literal, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from messaging.store._schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from messaging.store._database import Database

__all__ = [
    "FAILING",
    "FULL",
    "READ_ONLY",
    "answers",
    "refusal",
    "refusal_words",
    "refused_writes",
]

SQLITE_ROOM = 64 * 1024
"""Bytes a SQLite file's disk needs free to take writes: room for its log to grow."""
FULL = "full"
FAILING = "failing"
READ_ONLY = "read-only"

_MYSQL = {
    3: FULL,  # error writing file (errno 28: no space left on device)
    1021: FULL,  # disk full
    1114: FULL,  # the table is full
    1036: READ_ONLY,  # table is read only
    1290: READ_ONLY,  # the server runs with --read-only
    1792: READ_ONLY,  # cannot execute statement in a READ ONLY transaction
    1836: READ_ONLY,  # running in read-only mode
}
_SQLITE = {
    "database or disk is full": FULL,
    "disk i/o error": FAILING,
    "attempt to write a readonly database": READ_ONLY,
}


def refusal(exc: BaseException) -> str | None:
    """Why the database refused ``exc``'s write (:data:`FULL`, :data:`FAILING` or
    :data:`READ_ONLY`), or None when ``exc`` is no such refusal."""
    if not isinstance(exc, DBAPIError):
        return None
    args = getattr(exc.orig, "args", ())
    if args and isinstance(args[0], int):
        return _MYSQL.get(args[0])
    text = str(exc.orig).lower()
    return next((kind for found, kind in _SQLITE.items() if found in text), None)


def refusal_words(kind: str, url: URL | None) -> str:
    """A refusal of ``kind`` by the database at ``url``, as a user would act on it."""
    if url is None:
        return {
            FULL: "the database's disk is full",
            FAILING: "the database's disk fails to write",
        }.get(kind, "the database is read-only")
    if url.get_backend_name() == "sqlite":
        path = url.database or "the database file"
        return {
            FULL: f"the disk holding {path} is full",
            FAILING: f"the disk holding {path} fails to write (disk I/O error: full or failing)",
        }.get(kind, f"{path} is read-only (its or its folder's permissions, or the mount)")
    server = f"{url.host}:{url.port or 3306}"
    if kind == READ_ONLY:
        return f"the server {server} is read-only (read_only set: a replica, or an operator)"
    return f"the server {server} has no space left (its data directory's disk, or a table's limit)"


def answers(db: Database) -> bool:
    """Whether a query reaches the database now."""
    try:
        with db.read() as conn:
            conn.execute(select(literal(1))).scalar_one()
    except Exception:
        return False
    return True


def refused_writes(db: Database) -> str | None:
    """Why the database refuses writes now, in words, or None when it takes them.

    On MySQL/MariaDB a write that changes nothing is committed (the schema version's row,
    which no loop locks); errors other than a refusal go on. On SQLite nothing is written
    (that would wait behind every writer of the file): its disk is full with less than
    :data:`SQLITE_ROOM` bytes free, read-only when mounted so.
    """
    url = db.engine.url
    if db.is_sqlite:
        return _sqlite_refusal(url)
    t = db.schema.migrations
    try:
        with db.transaction() as conn:
            same = t.c.applied_at
            conn.execute(update(t).where(t.c.version == SCHEMA_VERSION).values(applied_at=same))
    except DBAPIError as exc:
        kind = refusal(exc)
        if kind is None:
            raise
        return refusal_words(kind, url)
    return None


def _sqlite_refusal(url: URL) -> str | None:
    if not url.database or url.database == ":memory:":
        return None
    folder = os.path.dirname(os.path.abspath(url.database))
    if shutil.disk_usage(folder).free < SQLITE_ROOM:
        return refusal_words(FULL, url)
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return refusal_words(READ_ONLY, url)
    return None
