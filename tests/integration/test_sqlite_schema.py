"""SQLite creates its schema on start; a file made by an older version is brought up to
date with the columns added since."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import insert, inspect, select

from messaging import Database
from messaging.store._schema import SCHEMA_VERSION


def test_a_file_from_the_previous_version_gets_the_new_columns_and_indexes(
    tmp_path: Path,
) -> None:
    """A V2 file (no ``rebuild_target``, no audit ``command_id`` nor its index) is upgraded
    by ``prepare()`` and marked current."""
    db = Database(f"sqlite:///{tmp_path}/old.db")
    try:
        db.prepare()
        consumers, audit, migrations = db.schema.consumers, db.schema.audit, db.schema.migrations
        index = f"{db.schema.prefix}ix_audit_command"
        with db.transaction() as conn:
            conn.exec_driver_sql(f'ALTER TABLE "{consumers.name}" DROP COLUMN rebuild_target')
            conn.exec_driver_sql(f'DROP INDEX "{index}"')
            conn.exec_driver_sql(f'ALTER TABLE "{audit.name}" DROP COLUMN command_id')
            conn.execute(migrations.delete())
            conn.execute(insert(migrations).values(version=2, name="create_all", applied_at=0))

        db.prepare()

        with db.read() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns(consumers.name)}
            audit_columns = {c["name"] for c in inspect(conn).get_columns(audit.name)}
            audit_indexes = {i["name"] for i in inspect(conn).get_indexes(audit.name)}
            versions = set(conn.execute(select(migrations.c.version)).scalars())
        assert "rebuild_target" in columns
        assert "command_id" in audit_columns
        assert index in audit_indexes
        assert versions == {2, SCHEMA_VERSION}
    finally:
        db.dispose()
