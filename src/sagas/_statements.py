"""The statement that moves stored saga instances on from the version read."""

from __future__ import annotations

from sqlalchemy import Executable, Integer, bindparam, case, literal_column, update
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.elements import ColumnElement

from messaging.store._database import Database


def update_statement(db: Database, of_saga: list[ColumnElement[bool]]) -> tuple[Executable, int]:
    """The statement that moves stored instances on from the version read (their state
    written at the saga's state version), and the row count each row that it updates adds.

    On MySQL a multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` whose assignments apply
    only where the stored version is the one read (each such row counts 2; a row whose
    version moved counts 0 or 1, one deleted meanwhile is inserted and counts 1): one
    statement, one round trip. Elsewhere an ``UPDATE ... WHERE version = read`` per row
    (SQLite runs in the process: no round trips to save)."""
    t = db.schema.sagas
    if db.is_sqlite:
        return (
            update(t)
            .where(
                *of_saga,
                t.c.saga_key == bindparam("b_key"),
                t.c.version == bindparam("b_next") - 1,
            )
            .values(
                version=bindparam("b_next"),
                state=bindparam("b_state"),
                ended=bindparam("b_ended", type_=Integer()),  # a bool as is: no conversion
                updated_at=bindparam("b_now"),
                state_version=bindparam("b_state_version"),
            )
        ), 1
    upsert = mysql.insert(t).values(
        tenant=bindparam("b_tenant"),
        saga=bindparam("b_saga"),
        saga_key=bindparam("b_key"),
        version=bindparam("b_next"),
        state=bindparam("b_state"),
        ended=bindparam("b_ended"),
        started_at=bindparam("b_now"),
        updated_at=bindparam("b_now"),
        state_version=bindparam("b_state_version"),
    )
    new = upsert.inserted
    # No bind outside VALUES (PyMySQL formats only those in a multi-row statement);
    # MySQL assigns left to right, each seeing the ones before: version goes last.
    read = t.c.version == new.version - literal_column("1")
    return upsert.on_duplicate_key_update(
        [
            (column.name, case((read, new[column.name]), else_=column))
            for column in (t.c.state, t.c.ended, t.c.updated_at, t.c.state_version, t.c.version)
        ]
    ), 2
