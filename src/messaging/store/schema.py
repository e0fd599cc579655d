"""The framework's tables, built once per table prefix, identical on SQLite and MySQL.

MySQL gets the same tables through the versioned SQL files in ``migrations/``; a test
checks that the two agree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql

SCHEMA_VERSION = 6
"""The newest schema migration this code expects."""

_TEXT = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
_SECONDS = Float(53)


class Schema:
    """All framework tables for one table prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.metadata = MetaData()
        m = self.metadata
        self.migrations = Table(
            f"{prefix}schema_migrations",
            m,
            Column("version", Integer, primary_key=True, autoincrement=False),
            Column("name", String(200), nullable=False),
            Column("applied_at", _SECONDS, nullable=False),
        )
        self.positions = Table(
            f"{prefix}positions",
            m,
            Column("tenant", String(64), primary_key=True),
            Column("last_position", BigInteger, nullable=False),
        )
        self.messages = Table(
            f"{prefix}messages",
            m,
            Column("tenant", String(64), nullable=False),
            Column("position", BigInteger, nullable=False, autoincrement=False),
            Column("topic", String(200), nullable=False),
            Column("source", String(200), nullable=False),
            Column("version", Integer, nullable=False),
            Column("type", String(200), nullable=False),
            Column("payload", _TEXT, nullable=False),
            Column("headers", _TEXT, nullable=True),
            Column("partition_hash", BigInteger, nullable=False),
            Column("recorded_at", _SECONDS, nullable=False),
            PrimaryKeyConstraint("tenant", "position"),
            UniqueConstraint(
                "tenant", "topic", "source", "version", name=f"{prefix}uq_source_version"
            ),
            Index(f"{prefix}ix_messages_topic", "tenant", "topic", "position"),
        )
        self.consumers = Table(
            f"{prefix}consumers",
            m,
            Column("tenant", String(64), nullable=False),
            Column("name", String(200), nullable=False),
            Column("kind", String(32), nullable=False),
            Column("distribution", String(32), nullable=False),
            Column("partitions", Integer, nullable=False),
            Column("topics", _TEXT, nullable=False),
            Column("types", _TEXT, nullable=False),
            Column("fingerprint", String(64), nullable=False),
            Column("previous_fingerprint", String(64), nullable=True),
            Column("state", String(32), nullable=False),
            Column("updated_at", _SECONDS, nullable=False),
            Column("retired_fingerprints", _TEXT, nullable=True),  # V2, hence last
            Column("rebuild_target", BigInteger, nullable=True),  # V4
            PrimaryKeyConstraint("tenant", "name"),
        )
        self.partitions = Table(
            f"{prefix}consumer_partitions",
            m,
            Column("tenant", String(64), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("partition_no", Integer, nullable=False, autoincrement=False),
            Column("owner", String(64), nullable=True),
            Column("epoch", BigInteger, nullable=False),
            Column("checkpoint", BigInteger, nullable=False),
            Column("status", String(16), nullable=False),
            Column("halted_position", BigInteger, nullable=True),
            Column("halted_type", String(200), nullable=True),
            Column("error", _TEXT, nullable=True),
            Column("halted_at", _SECONDS, nullable=True),
            Column("updated_at", _SECONDS, nullable=False),
            Column("halted_trace", _TEXT, nullable=True),  # V6
            PrimaryKeyConstraint("tenant", "consumer", "partition_no"),
            Index(f"{prefix}ix_partitions_owner", "tenant", "owner"),
        )
        self.audit = Table(
            f"{prefix}audit",
            m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("tenant", String(64), nullable=False),
            Column("at", _SECONDS, nullable=False),
            Column("who", String(200), nullable=False),
            Column("command", String(32), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("detail", _TEXT, nullable=True),
            Index(f"{prefix}ix_audit_consumer", "tenant", "consumer", "id"),
        )
        self.instances = Table(
            f"{prefix}instances",
            m,
            Column("tenant", String(64), nullable=False),
            Column("id", String(64), nullable=False),
            Column("name", String(200), nullable=False),
            Column("host", String(200), nullable=False),
            Column("pid", Integer, nullable=False),
            Column("started_at", _SECONDS, nullable=False),
            Column("heartbeat_at", _SECONDS, nullable=False),
            Column("stopping", Boolean, nullable=False),
            Column("runs", _TEXT, nullable=False),
            Column("in_memory", _TEXT, nullable=True),  # V6
            PrimaryKeyConstraint("tenant", "id"),
            Index(f"{prefix}ix_instances_heartbeat", "tenant", "heartbeat_at"),
        )
        self.processed = Table(
            f"{prefix}processed_messages",
            m,
            Column("tenant", String(64), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("message_id", String(200), nullable=False),
            Column("position", BigInteger, nullable=False),
            Column("processed_at", _SECONDS, nullable=False),
            PrimaryKeyConstraint("tenant", "consumer", "message_id"),
        )
        self.sagas = Table(
            f"{prefix}sagas",
            m,
            Column("tenant", String(64), nullable=False),
            Column("saga", String(200), nullable=False),
            Column("saga_key", String(200), nullable=False),
            Column("version", Integer, nullable=False),
            Column("state", _TEXT, nullable=False),
            Column("ended", Boolean, nullable=False),
            Column("started_at", _SECONDS, nullable=False),
            Column("updated_at", _SECONDS, nullable=False),
            PrimaryKeyConstraint("tenant", "saga", "saga_key"),
        )
        self.deadlines = Table(
            f"{prefix}deadlines",
            m,
            Column("tenant", String(64), nullable=False),
            Column("saga", String(200), nullable=False),
            Column("saga_key", String(200), nullable=False),
            Column("name", String(200), nullable=False),
            Column("partition_no", Integer, nullable=False, autoincrement=False),
            Column("due_at", _SECONDS, nullable=False),
            Column("type", String(200), nullable=False),
            Column("payload", _TEXT, nullable=False),
            Column("scheduled_at", _SECONDS, nullable=False),
            PrimaryKeyConstraint("tenant", "saga", "saga_key", "name"),
            Index(f"{prefix}ix_deadlines_due", "tenant", "saga", "partition_no", "due_at"),
        )
        self.read_models = Table(
            f"{prefix}read_models",
            m,
            Column("table_key", String(64), primary_key=True),  # the name, lower case
            Column("table_name", String(64), nullable=False),
            Column("tenant", String(64), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("registered_at", _SECONDS, nullable=False),
        )
