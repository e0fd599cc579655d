"""Versioned schema migrations: SQL files for MySQL, ``create_all`` for embedded SQLite.

MySQL files are named ``V<version>__<description>.sql`` and use ``{prefix}`` for the
table prefix; versions start at 1 and increase, possibly skipping a number. ``projections
db migrate`` applies the missing ones in order; an instance refuses to start on a schema
that is behind and names what is missing.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from importlib import resources
from typing import Protocol

import attrs
from sqlalchemy import Connection, Engine, insert, inspect, select

from messaging._errors import SchemaError
from messaging.store._clock import Clock
from messaging.store._schema import SCHEMA_VERSION, Schema


class Database(Protocol):
    """What the migrations use of a :class:`~messaging.store._database.Database` (which
    calls them: this module does not import it)."""

    engine: Engine
    schema: Schema
    clock: Clock

    @property
    def is_sqlite(self) -> bool: ...

    def read(self) -> AbstractContextManager[Connection]: ...

    def transaction(self) -> AbstractContextManager[Connection]: ...


_FILE_NAME = re.compile(r"^V(\d+)__(\w+)\.sql$")


@attrs.define(frozen=True)
class Migration:
    """One versioned migration file."""

    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        return f"V{self.version}__{self.name}"

    def statements(self, prefix: str) -> list[str]:
        """The file's SQL statements with the table prefix filled in."""
        text = "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        )
        return [s.strip() for s in text.replace("{prefix}", prefix).split(";") if s.strip()]


def available_migrations() -> list[Migration]:
    """The MySQL migrations shipped with the package, in version order."""
    found = []
    for entry in resources.files("messaging.store._migrations.mysql").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions[:1] != [1] or len(set(versions)) < len(versions) or versions[-1] != SCHEMA_VERSION:
        raise SchemaError(f"migration files {versions} do not run from 1 to {SCHEMA_VERSION}")
    return found


def applied_versions(conn: Connection, db: Database) -> set[int]:
    """Versions recorded as applied; empty when the migrations table does not exist."""
    table = db.schema.migrations
    if not inspect(conn).has_table(table.name):
        return set()
    return set(conn.execute(select(table.c.version)).scalars())


def migrate(db: Database) -> list[str]:
    """Apply the missing MySQL migrations in order; return the labels applied."""
    if db.is_sqlite:
        create_sqlite_schema(db)
        return []
    table = db.schema.migrations
    applied: list[str] = []
    with db.engine.begin() as conn:
        table.create(conn, checkfirst=True)
    for migration in available_migrations():
        with db.engine.begin() as conn:
            if migration.version in applied_versions(conn, db):
                continue
            for statement in migration.statements(db.schema.prefix):
                conn.exec_driver_sql(statement)
            conn.execute(
                insert(table).values(
                    version=migration.version, name=migration.name, applied_at=db.clock.now()
                )
            )
        applied.append(migration.label)
    return applied


def check_schema(db: Database) -> None:
    """Refuse a MySQL schema that is behind or ahead of this code, naming the difference."""
    with db.read() as conn:
        applied = applied_versions(conn, db)
    _check_versions(applied, available_migrations())


def _check_versions(applied: set[int], shipped: list[Migration]) -> None:
    missing = [m.label for m in shipped if m.version not in applied]
    if missing:
        raise SchemaError(
            f"database schema is behind: missing migration {', '.join(missing)}; "
            "run `projections db migrate`"
        )
    newer = sorted(v for v in applied if v > SCHEMA_VERSION)
    if newer:
        raise SchemaError(
            f"database schema version {newer[-1]} is newer than this code "
            f"(expects {SCHEMA_VERSION}); upgrade the package"
        )


def create_sqlite_schema(db: Database) -> None:
    """Create every table on SQLite and record the schema version (idempotent). A file
    made by an older version gets the columns (nullable, or with their defaults) and indexes
    added since."""
    table = db.schema.migrations
    db.schema.extend()  # the tables of consumer kinds registered since it was built
    with db.read() as conn:  # the common case, without the write lock (a crowd starting)
        if _sqlite_schema_current(conn, db):
            return
    with db.transaction() as conn:
        db.schema.metadata.create_all(conn)
        applied = set(conn.execute(select(table.c.version)).scalars())
        newer = [v for v in applied if v > SCHEMA_VERSION]
        if newer:
            _check_versions(applied, [])
        if SCHEMA_VERSION not in applied:
            _add_missing_columns_and_indexes(conn, db)
            conn.execute(
                insert(table).values(
                    version=SCHEMA_VERSION, name="create_all", applied_at=db.clock.now()
                )
            )


def _sqlite_schema_current(conn: Connection, db: Database) -> bool:
    """Whether every table is there and this version's schema recorded (none newer)."""
    present = set(inspect(conn).get_table_names())
    if any(table.name not in present for table in db.schema.metadata.sorted_tables):
        return False
    applied = set(conn.execute(select(db.schema.migrations.c.version)).scalars())
    return max(applied, default=0) == SCHEMA_VERSION


def _add_missing_columns_and_indexes(conn: Connection, db: Database) -> None:
    inspector = inspect(conn)
    for table in db.schema.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                kind = column.type.compile(dialect=conn.dialect)
                default = getattr(getattr(column.server_default, "arg", None), "text", None)
                if default is not None:  # NOT NULL with its default (the rows there get it)
                    kind += f" NOT NULL DEFAULT {default}"
                conn.exec_driver_sql(
                    f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}'
                )
        for index in table.indexes:
            index.create(conn, checkfirst=True)
