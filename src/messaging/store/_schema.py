"""The framework's tables, built once per table prefix, identical on SQLite and MySQL.

MySQL gets the same tables through the versioned SQL files in ``migrations/``; a test
checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 13
"""The newest schema migration this code expects."""

LONG_TEXT = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
SECONDS = Float(53)


class SecondsAsGiven(TypeDecorator[float]):
    """:data:`SECONDS` bound as the driver takes it, for a value that is a float already
    (the database's clock as read): no conversion per value, so a batch's rows can go to
    the driver as the tuples they are built as (:mod:`messaging.store._fastpath`)."""

    impl = Float
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None


AS_GIVEN = SecondsAsGiven(53)


TableBuilder = Callable[[MetaData, str], Mapping[str, Table]]
"""Builds a consumer kind's own tables on a metadata, for a table prefix."""

_EXTENSIONS: dict[str, TableBuilder] = {}


def register_tables(owner: str, builder: TableBuilder) -> None:
    """Add ``owner``'s tables to every schema (those built from now on, and the attributes
    of those built before, on first use). Called by :func:`messaging._kinds.register_kind`."""
    _EXTENSIONS[owner] = builder


class Schema:
    """All framework tables for one table prefix: the core ones as attributes, and those
    of the registered consumer kinds as attributes too (``schema.<table>``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.metadata = MetaData()
        m = self.metadata
        self.migrations = Table(
            f"{prefix}schema_migrations",
            m,
            Column("version", Integer, primary_key=True, autoincrement=False),
            Column("name", String(200), nullable=False),
            Column("applied_at", SECONDS, nullable=False),
        )
        self.positions = Table(
            f"{prefix}positions",
            m,
            Column("tenant", String(64), primary_key=True),
            Column("last_position", BigInteger, nullable=False),
        )
        self.generations = Table(
            f"{prefix}generations",
            m,
            Column("tenant", String(64), primary_key=True),
            Column("generation", BigInteger, nullable=False),
        )
        """V7: bumped by every change of membership or ownership (see
        :mod:`messaging.distribution._pulse`)."""
        self.messages = Table(
            f"{prefix}messages",
            m,
            Column("tenant", String(64), nullable=False),
            Column("position", BigInteger, nullable=False, autoincrement=False),
            Column("topic", String(200), nullable=False),
            Column("source", String(200), nullable=False),
            Column("version", Integer, nullable=False),
            Column("type", String(200), nullable=False),
            Column("payload", LONG_TEXT, nullable=False),
            Column("headers", LONG_TEXT, nullable=True),
            Column("partition_hash", BigInteger, nullable=False),
            Column("recorded_at", SECONDS, nullable=False),
            # V13: the version of the payload's shape, from its class (1 for older rows)
            Column("payload_version", Integer, nullable=False, server_default=text("1")),
            PrimaryKeyConstraint("tenant", "position"),
            UniqueConstraint(
                "tenant", "topic", "source", "version", name=f"{prefix}uq_source_version"
            ),
            Index(f"{prefix}ix_messages_topic", "tenant", "topic", "position"),
            # V13: `projections messages check` reads the distinct shapes from it alone
            Index(f"{prefix}ix_messages_shape", "tenant", "topic", "type", "payload_version"),
        )
        self.consumers = Table(
            f"{prefix}consumers",
            m,
            Column("tenant", String(64), nullable=False),
            Column("name", String(200), nullable=False),
            Column("kind", String(32), nullable=False),
            Column("distribution", String(32), nullable=False),
            Column("partitions", Integer, nullable=False),
            Column("topics", LONG_TEXT, nullable=False),
            Column("types", LONG_TEXT, nullable=False),
            Column("fingerprint", String(64), nullable=False),
            Column("previous_fingerprint", String(64), nullable=True),
            Column("state", String(32), nullable=False),
            Column("updated_at", SECONDS, nullable=False),
            Column("retired_fingerprints", LONG_TEXT, nullable=True),  # V2, hence last
            Column("rebuild_target", BigInteger, nullable=True),  # V4
            Column("version", Integer, nullable=True),  # V10: the live version (NULL: 1)
            Column("cutover", LONG_TEXT, nullable=True),  # V10: a version taking over (JSON)
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
            Column("error", LONG_TEXT, nullable=True),
            Column("halted_at", SECONDS, nullable=True),
            Column("updated_at", SECONDS, nullable=False),
            Column("halted_trace", LONG_TEXT, nullable=True),  # V6
            Column("needs", LONG_TEXT, nullable=True),  # V13: a newer payload stops it (JSON)
            PrimaryKeyConstraint("tenant", "consumer", "partition_no"),
            Index(f"{prefix}ix_partitions_owner", "tenant", "owner"),
        )
        self.audit = Table(
            f"{prefix}audit",
            m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("tenant", String(64), nullable=False),
            Column("at", SECONDS, nullable=False),
            Column("who", String(200), nullable=False),
            Column("command", String(32), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("detail", LONG_TEXT, nullable=True),
            Column("command_id", String(32), nullable=True),  # V9
            Index(f"{prefix}ix_audit_consumer", "tenant", "consumer", "id"),
            Index(f"{prefix}ix_audit_command", "tenant", "command_id"),
        )
        self.instances = Table(
            f"{prefix}instances",
            m,
            Column("tenant", String(64), nullable=False),
            Column("id", String(64), nullable=False),
            Column("name", String(200), nullable=False),
            Column("host", String(200), nullable=False),
            Column("pid", Integer, nullable=False),
            Column("started_at", SECONDS, nullable=False),
            Column("heartbeat_at", SECONDS, nullable=False),
            Column("stopping", Boolean, nullable=False),
            Column("runs", LONG_TEXT, nullable=False),
            Column("in_memory", LONG_TEXT, nullable=True),  # V6
            Column("sessions", LONG_TEXT, nullable=True),  # V8: its MySQL sessions (JSON)
            Column("liveness", LONG_TEXT, nullable=True),  # V11: its liveness signal (JSON)
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
            Column("processed_at", SECONDS, nullable=False),
            PrimaryKeyConstraint("tenant", "consumer", "message_id"),
        )
        self.parked = Table(
            f"{prefix}parked_sources",
            m,
            Column("tenant", String(64), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("source", String(200), nullable=False),
            Column("partition_no", Integer, nullable=False, autoincrement=False),
            Column("position", BigInteger, nullable=False),
            Column("type", String(200), nullable=False),
            Column("error", LONG_TEXT, nullable=True),
            Column("trace", LONG_TEXT, nullable=True),
            Column("parked_at", SECONDS, nullable=False),
            Column("state", String(16), nullable=False),
            PrimaryKeyConstraint("tenant", "consumer", "source"),
            Index(f"{prefix}ix_parked_partition", "tenant", "consumer", "partition_no"),
        )
        """V12: a consumer's parked sources: its messages from ``position`` on are held back
        (see :mod:`messaging.failures._parking`)."""
        self.skipped = Table(
            f"{prefix}skipped_messages",
            m,
            Column("tenant", String(64), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("position", BigInteger, nullable=False, autoincrement=False),
            Column("source", String(200), nullable=False),
            Column("partition_no", Integer, nullable=False, autoincrement=False),
            Column("type", String(200), nullable=False),
            Column("error", LONG_TEXT, nullable=True),
            Column("skipped_at", SECONDS, nullable=False),
            Column("who", String(200), nullable=False),
            PrimaryKeyConstraint("tenant", "consumer", "position"),
            Index(f"{prefix}ix_skipped_source", "tenant", "consumer", "source"),
        )
        """V12: messages an operator skipped (never applied unless retried)."""
        self.read_models = Table(
            f"{prefix}read_models",
            m,
            Column("table_key", String(64), primary_key=True),  # the name, lower case
            Column("table_name", String(64), nullable=False),
            Column("tenant", String(64), nullable=False),
            Column("consumer", String(200), nullable=False),
            Column("registered_at", SECONDS, nullable=False),
        )
        self._extensions: dict[str, Table] = {}
        self._extended: set[str] = set()
        self.extend()

    def extend(self) -> None:
        """Build the tables of consumer kinds registered since (idempotent)."""
        for owner, builder in list(_EXTENSIONS.items()):
            if owner not in self._extended:
                self._extended.add(owner)
                self._extensions.update(builder(self.metadata, self.prefix))

    def __getattr__(self, name: str) -> Table:
        if name.startswith("_"):
            raise AttributeError(name)
        self.extend()
        try:
            return self._extensions[name]
        except KeyError:
            raise AttributeError(f"the schema has no table {name!r}") from None
