"""The registry of physical read-model tables: which tenant owns each.

Tenants sharing a database never share a read-model table (see
:mod:`messaging.store._tenancy`). Names could still meet: the default tenant may declare a
table named ``acme__stock``, which is tenant ``acme``'s copy of ``stock``. Every
declaration therefore records its tenant as the owner of its physical tables before
creating them, and a table another tenant owns is refused, naming both.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Table, insert, select
from sqlalchemy.exc import IntegrityError

from messaging._errors import RegistrationError
from messaging.store._database import Database


def register(db: Database, conn: Connection, consumer: str, tables: Sequence[Table]) -> None:
    """Record ``db``'s tenant as the owner of the physical ``tables`` of ``consumer``.
    RegistrationError, naming the table and both tenants, if another tenant owns one
    (names are compared case-insensitively, as MySQL may)."""
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
        if row.tenant != db.tenant:
            raise RegistrationError(
                f"read-model table {table.name!r} of consumer {consumer!r} would be written "
                f"by tenant {db.tenant!r} and by tenant {row.tenant!r} (whose consumer "
                f"{row.consumer!r} owns it as {row.table_name!r}): rename the table or use "
                "another tenant name"
            )
