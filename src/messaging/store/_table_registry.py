"""The registry of physical read-model tables: which tenant owns each.

Tenants sharing a database never share a read-model table (see
:mod:`messaging.store._tenancy`). Names could still meet: the default tenant may declare a
table named ``acme__stock``, which is tenant ``acme``'s copy of ``stock``. Every
declaration therefore records its tenant as the owner of its physical tables before
creating them, and a table another tenant owns is refused, naming both.

A table kept by ``projections remove`` stays registered, to :func:`removed_owner` of its
consumer: declaring a table of that name again is refused until it is dropped, so that
no new consumer applies its messages into rows it did not write.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Table, insert, select
from sqlalchemy.exc import IntegrityError

from messaging._errors import RegistrationError
from messaging.store._database import Database

_REMOVED = "@removed"
"""Appended to a removed consumer's name as the owner of the tables it kept (no consumer
name holds ``@``)."""


def removed_owner(consumer: str) -> str:
    """The registry's owner of the tables that the removal of ``consumer`` kept."""
    return f"{consumer}{_REMOVED}"


def register(db: Database, conn: Connection, consumer: str, tables: Sequence[Table]) -> None:
    """Record ``db``'s tenant as the owner of the physical ``tables`` of ``consumer``.
    RegistrationError, naming the table and both tenants, if another tenant owns one
    (names are compared case-insensitively, as MySQL may), or if a removed consumer's
    tables were kept under one of the names."""
    registry = db.schema.read_models
    for table in tables:
        key = table.name.lower()
        owner = select(registry.c.tenant, registry.c.table_name, registry.c.consumer).where(
            registry.c.table_key == key
        )
        row = conn.execute(owner.with_for_update()).first()
        if row is None:
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(registry).values(
                            table_key=key,
                            table_name=table.name,
                            tenant=db.tenant,
                            consumer=consumer,
                            registered_at=db.clock.now(),
                        )
                    )
                continue
            except IntegrityError:  # registered concurrently: check who did
                row = conn.execute(owner.with_for_update()).one()
        if row.tenant == db.tenant and row.consumer.endswith(_REMOVED):
            removed = row.consumer.removesuffix(_REMOVED)
            raise RegistrationError(
                f"read-model table {table.name!r} of consumer {consumer!r} was kept when "
                f"consumer {removed!r} was removed: drop it with `projections remove "
                f"{removed} --drop-tables`, or declare a table of another name"
            )
        if row.tenant != db.tenant:
            raise RegistrationError(
                f"read-model table {table.name!r} of consumer {consumer!r} would be written "
                f"by tenant {db.tenant!r} and by tenant {row.tenant!r} (whose consumer "
                f"{row.consumer!r} owns it as {row.table_name!r}): rename the table or use "
                "another tenant name"
            )
