"""SQLite creates its schema on start; a file made by an older version is brought up to
date with the columns added since."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import insert, inspect, select

from messaging import Database
from messaging.store.schema import SCHEMA_VERSION


def test_a_file_from_the_previous_version_gets_the_new_columns(tmp_path: Path) -> None:
    """A V2 file (no ``rebuild_target``) is upgraded by ``prepare()`` and marked current."""
    db = Database(f"sqlite:///{tmp_path}/old.db")
    try:
        db.prepare()
        consumers, migrations = db.schema.consumers, db.schema.migrations
        with db.transaction() as conn:
            conn.exec_driver_sql(f'ALTER TABLE "{consumers.name}" DROP COLUMN rebuild_target')
            conn.execute(migrations.delete())
            conn.execute(insert(migrations).values(version=2, name="create_all", applied_at=0))

        db.prepare()

        with db.read() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns(consumers.name)}
            versions = set(conn.execute(select(migrations.c.version)).scalars())
        assert "rebuild_target" in columns
        assert versions == {2, SCHEMA_VERSION}
    finally:
        db.dispose()
