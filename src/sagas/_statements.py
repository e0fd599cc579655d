"""The statement that moves stored saga instances on from the version read."""

from __future__ import annotations

from sqlalchemy import Executable, Integer, bindparam, case, literal_column, update
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.elements import ColumnElement

from messaging import Database
from messaging.kinds import AS_GIVEN

SQLITE_ROW = ("b_next", "b_state", "b_ended", "b_now", "b_state_version", "b_key", "b_read")
"""The values of one row of the SQLite statement, in the order the driver takes them."""
MYSQL_ROW = (
    *("b_tenant", "b_saga", "b_key", "b_next", "b_state", "b_ended", "b_now", "b_now"),
    "b_state_version",
)
"""The values of one row of the MySQL statement, in the order the driver takes them."""


def _quoted(value: str) -> ColumnElement[str]:
    """``value`` as an SQL string literal (quotes doubled): no parameter to bind per row."""
    return literal_column("'" + value.replace("'", "''") + "'")


def update_statement(db: Database, saga: str) -> tuple[Executable, tuple[str, ...], int]:
    """The statement that moves stored instances of ``saga`` on from the version read
    (their state written at the saga's state version), the names of a row's values in
    the order the driver takes them (:data:`SQLITE_ROW`, :data:`MYSQL_ROW`: each row is
    handed over as a tuple of those), and the row count each row that it updates adds.

    On MySQL a multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` whose assignments apply
    only where the stored version is the one read (each such row counts 2; a row whose
    version moved counts 0 or 1, one deleted meanwhile is inserted and counts 1): one
    statement, one round trip. Elsewhere an ``UPDATE ... WHERE version = read`` per row
    (SQLite runs in the process: no round trips to save; tenant and saga written into
    the statement, not bound for every row)."""
    t = db.schema.sagas
    if db.is_sqlite:
        return (
            (
                update(t)
                .where(
                    t.c.tenant == _quoted(db.tenant),
                    t.c.saga == _quoted(saga),
                    t.c.saga_key == bindparam("b_key"),
                    t.c.version == bindparam("b_read"),
                )
                .values(
                    version=bindparam("b_next"),
                    state=bindparam("b_state"),
                    ended=bindparam("b_ended", type_=Integer()),  # a bool as is: no conversion
                    updated_at=bindparam("b_now", type_=AS_GIVEN),
                    state_version=bindparam("b_state_version"),
                )
            ),
            SQLITE_ROW,
            1,
        )
    upsert = mysql.insert(t).values(
        tenant=bindparam("b_tenant"),
        saga=bindparam("b_saga"),
        saga_key=bindparam("b_key"),
        version=bindparam("b_next"),
        state=bindparam("b_state"),
        ended=bindparam("b_ended", type_=Integer()),
        started_at=bindparam("b_now", type_=AS_GIVEN),
        updated_at=bindparam("b_now", type_=AS_GIVEN),
        state_version=bindparam("b_state_version"),
    )
    new = upsert.inserted
    # No bind outside VALUES (PyMySQL formats only those in a multi-row statement);
    # MySQL assigns left to right, each seeing the ones before: version goes last.
    read = t.c.version == new.version - literal_column("1")
    return (
        upsert.on_duplicate_key_update(
            [
                (column.name, case((read, new[column.name]), else_=column))
                for column in (t.c.state, t.c.ended, t.c.updated_at, t.c.state_version, t.c.version)
            ]
        ),
        MYSQL_ROW,
        2,
    )
