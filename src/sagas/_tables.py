"""The saga tables: versioned states and scheduled deadlines (created on MySQL by the V3
migration, on SQLite with the rest of the schema)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import (
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    text,
)

from messaging.kinds import LONG_TEXT, SECONDS


def saga_tables(m: MetaData, prefix: str) -> Mapping[str, Table]:
    """The ``sagas`` and ``deadlines`` tables for ``prefix`` (schema attributes of those names)."""
    sagas = Table(
        f"{prefix}sagas",
        m,
        Column("tenant", String(64), nullable=False),
        Column("saga", String(200), nullable=False),
        Column("saga_key", String(200), nullable=False),
        Column("version", Integer, nullable=False),
        Column("state", LONG_TEXT, nullable=False),
        Column("ended", Boolean, nullable=False),
        Column("started_at", SECONDS, nullable=False),
        Column("updated_at", SECONDS, nullable=False),
        # V13: the version of the state's shape (1 for states stored before)
        Column("state_version", Integer, nullable=False, server_default=text("1")),
        PrimaryKeyConstraint("tenant", "saga", "saga_key"),
    )
    deadlines = Table(
        f"{prefix}deadlines",
        m,
        Column("tenant", String(64), nullable=False),
        Column("saga", String(200), nullable=False),
        Column("saga_key", String(200), nullable=False),
        Column("name", String(200), nullable=False),
        Column("partition_no", Integer, nullable=False, autoincrement=False),
        Column("due_at", SECONDS, nullable=False),
        Column("type", String(200), nullable=False),
        Column("payload", LONG_TEXT, nullable=False),
        Column("scheduled_at", SECONDS, nullable=False),
        # V13: the version of the payload's shape (1 for deadlines scheduled before)
        Column("payload_version", Integer, nullable=False, server_default=text("1")),
        PrimaryKeyConstraint("tenant", "saga", "saga_key", "name"),
        Index(f"{prefix}ix_deadlines_due", "tenant", "saga", "partition_no", "due_at"),
    )
    return {"sagas": sagas, "deadlines": deadlines}
