"""Throwaway databases for simulated clusters: a temporary SQLite file by default, or the
SQLite/MySQL/MariaDB URL a test run is configured with, cleaned up afterwards.

The URL comes from ``--projections-database``, then ``$PROJECTIONS_TEST_DATABASE``, then
the ``projections_database`` ini option (see :mod:`projections.testing.plugin`).
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Table, inspect, text
from sqlalchemy.exc import OperationalError

from messaging import ConfigError, Database
from messaging.operations import ManualClock, migrate

DATABASE_ENV = "PROJECTIONS_TEST_DATABASE"
"""The environment variable naming the database simulated clusters use."""

_configured: list[str | None] = [None]


def configure_database(url: str | None) -> str | None:
    """Make ``url`` the database of every simulated cluster opened without one (None: the
    environment variable, else a temporary SQLite file); return the one it replaces. The
    pytest plugin calls it."""
    previous, _configured[0] = _configured[0], url
    return previous


def configured_database() -> str | None:
    """The configured database URL, or None for a temporary SQLite file."""
    return _configured[0] or os.environ.get(DATABASE_ENV) or None


def drop_tables(db: Database, tables: Iterable[str] = ()) -> None:
    """Drop every table of ``db``'s prefix and the named ``tables``, with their versions'
    copies (``_vN__<table>``), where they exist."""
    extra = set(tables)
    with db.engine.begin() as conn:
        for name in inspect(conn).get_table_names():
            versioned = re.fullmatch(r"_v\d+__(.+)", name)
            base = name if versioned is None else versioned.group(1)
            if base.startswith(db.schema.prefix) or base in extra:
                conn.execute(text(f"DROP TABLE IF EXISTS `{name}`"))


@contextmanager
def scratch_database(url: str | None, read_models: Iterable[Table] = ()) -> Iterator[Database]:
    """A prepared database with a :class:`ManualClock` and empty ``read_models``, gone when
    the block ends.

    Without ``url``: a temporary SQLite file. With one: tables under a table prefix of
    their own, migrated on MySQL; the ``read_models`` (whose names carry no prefix) are
    dropped before, in case an interrupted run left them, and after. One test database
    therefore serves one test run at a time.
    """
    with tempfile.TemporaryDirectory(prefix="projections-") as directory:
        if url is None:
            db = Database(f"sqlite:///{Path(directory) / 'cluster.db'}", clock=ManualClock())
        else:
            prefix = f"k{uuid.uuid4().hex[:8]}_"
            db = Database(url, table_prefix=prefix, clock=ManualClock())
        tables = list(read_models)
        names = [table.name for table in tables]
        try:
            if url is not None:
                drop_tables(db, names)
                migrate(db)
            db.prepare()
            with db.transaction() as conn:
                for table in tables:
                    table.create(conn, checkfirst=True)
        except OperationalError as exc:
            db.dispose()
            raise ConfigError(
                f"the test database {db!r} cannot be reached or prepared: {exc} "
                f"(configured by --projections-database or ${DATABASE_ENV})"
            ) from exc
        try:
            yield db
        finally:
            if url is not None:
                drop_tables(db, names)
            db.dispose()
