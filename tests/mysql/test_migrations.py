"""MySQL schema migrations: the start-up check and agreement of V1 with messaging.store._schema."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Table, UniqueConstraint, insert, inspect, select, text
from sqlalchemy.dialects import mysql

from messaging import Database, SchemaError
from messaging.store._migrations import available_migrations, migrate
from messaging.store._schema import SCHEMA_VERSION

pytestmark = pytest.mark.mysql

MYSQL_URL_ENV = "PROJECTIONS_TEST_MYSQL_URL"


@pytest.fixture
def fresh(tmp_path: object) -> Iterator[Database]:
    """A MySQL Database on a table prefix nobody has used; its tables are dropped afterwards."""
    url = os.environ.get(MYSQL_URL_ENV)
    if not url:
        pytest.skip(f"{MYSQL_URL_ENV} is not set")
    db = Database(url, table_prefix=f"m{uuid.uuid4().hex[:8]}_")
    yield db
    try:
        with db.engine.begin() as conn:
            for name in inspect(conn).get_table_names():
                if name.startswith(db.schema.prefix):
                    conn.execute(text(f"DROP TABLE IF EXISTS `{name}`"))
    finally:
        db.dispose()


def _prefixed_tables(db: Database) -> set[str]:
    with db.engine.connect() as conn:
        return {n for n in inspect(conn).get_table_names() if n.startswith(db.schema.prefix)}


def test_unmigrated_database_is_refused_naming_v1(fresh: Database) -> None:
    """prepare() on a MySQL database without migrations raises SchemaError naming V1."""
    with pytest.raises(SchemaError) as info:
        fresh.prepare()
    assert "V1__initial_schema" in str(info.value)
    assert "projections db migrate" in str(info.value)
    assert _prefixed_tables(fresh) == set(), "the check must not create anything"


def test_empty_migrations_table_is_refused_naming_v1(fresh: Database) -> None:
    """A migrations table without the V1 row still counts as V1 missing."""
    with fresh.engine.begin() as conn:
        fresh.schema.migrations.create(conn)
    with pytest.raises(SchemaError, match="V1__initial_schema"):
        fresh.prepare()


def test_migrate_applies_v1_once_then_prepare_succeeds(fresh: Database) -> None:
    """migrate() applies every shipped migration once; afterwards prepare() accepts the schema."""
    assert available_migrations()[0].label == "V1__initial_schema"
    assert migrate(fresh) == [m.label for m in available_migrations()]
    assert migrate(fresh) == []
    fresh.prepare()
    fresh.prepare()
    positions = fresh.schema.positions
    with fresh.read() as conn:
        rows = conn.execute(select(positions.c.tenant, positions.c.last_position)).all()
        versions = conn.execute(select(fresh.schema.migrations.c.version)).scalars().all()
    assert [tuple(r) for r in rows] == [("default", 0)]
    assert versions == [m.version for m in available_migrations()]
    assert versions[-1] == SCHEMA_VERSION


def test_newer_schema_is_refused(fresh: Database) -> None:
    """A database migrated past this code's version is refused with SchemaError."""
    migrate(fresh)
    with fresh.engine.begin() as conn:
        conn.execute(
            insert(fresh.schema.migrations).values(
                version=SCHEMA_VERSION + 1, name="from_the_future", applied_at=0.0
            )
        )
    with pytest.raises(SchemaError, match="newer"):
        fresh.prepare()


def _type_name(type_: object) -> str:
    """A column type as MySQL stores it: integer display widths dropped, aliases resolved."""
    rendered = str(type_.compile(dialect=mysql.dialect())).upper()  # type: ignore[attr-defined]
    rendered = re.sub(r"^(TINYINT|INTEGER|BIGINT)\(\d+\)$", r"\1", rendered)
    return {"FLOAT(53)": "DOUBLE", "BOOL": "TINYINT"}.get(rendered, rendered)


def _declared(table: Table) -> dict[str, tuple[str, bool]]:
    return {c.name: (_type_name(c.type), bool(c.nullable)) for c in table.columns}


def test_migrated_schema_matches_schema_module(fresh: Database) -> None:
    """Every table V1 creates has exactly the columns, keys and indexes of
    messaging.store._schema."""
    migrate(fresh)
    declared = fresh.schema.metadata.tables
    assert _prefixed_tables(fresh) == set(declared)
    with fresh.engine.connect() as conn:
        inspector = inspect(conn)
        for name, table in declared.items():
            columns = inspector.get_columns(name)
            reflected = {c["name"]: (_type_name(c["type"]), bool(c["nullable"])) for c in columns}
            assert [c["name"] for c in columns] == [c.name for c in table.columns], name
            assert reflected == _declared(table), name
            assert inspector.get_pk_constraint(name)["constrained_columns"] == [
                c.name for c in table.primary_key.columns
            ], name
            reflected_indexes = {
                i["name"]: (tuple(i["column_names"]), bool(i["unique"]))
                for i in inspector.get_indexes(name)
            }
            declared_indexes: dict[object, tuple[tuple[str, ...], bool]] = {
                i.name: (tuple(c.name for c in i.columns), bool(i.unique)) for i in table.indexes
            }
            declared_indexes.update(
                {
                    u.name: (tuple(c.name for c in u.columns), True)
                    for u in table.constraints
                    if isinstance(u, UniqueConstraint)
                }
            )
            assert reflected_indexes == declared_indexes, name


def test_a_schema_one_migration_behind_is_refused_naming_it(fresh: Database) -> None:
    """After V1 alone, start names V2 as the missing migration."""
    migrate(fresh)
    with fresh.engine.begin() as conn:
        conn.execute(fresh.schema.migrations.delete().where(fresh.schema.migrations.c.version == 2))
    with pytest.raises(SchemaError, match="missing migration V2__operator_audit"):
        fresh.prepare()
