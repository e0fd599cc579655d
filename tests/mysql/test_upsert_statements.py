"""On MySQL/MariaDB a batch's upserts reach the server as one multi-row statement per shape
(PyMySQL rewrites only ``INSERT … VALUES … ON DUPLICATE KEY UPDATE … VALUES()``)."""

from __future__ import annotations

from sqlalchemy import Connection, select

from messaging import Database, HandlerContext
from projections.examples import ledger


def _inserts(conn: Connection) -> int:
    """The INSERT statements this session sent so far (a multi-row one counts once)."""
    row = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Com_insert'").one()
    return int(row[1])


def test_the_ledgers_upserts_of_a_batch_are_one_statement_per_shape(db: Database) -> None:
    with db.transaction() as conn:
        ledger.metadata.create_all(conn)
    balances = ledger.Balances()
    for batch in range(2):  # the second batch goes straight to the driver
        with db.transaction() as conn:
            ctx = HandlerContext(conn, lambda: {})
            before = _inserts(conn)
            for n in range(200):
                account = f"acct-{n % 40:02d}"
                if batch == 0 and n < 40:
                    balances.opened(ledger.AccountOpened(account, "ada"), ctx)
                else:
                    balances.deposited(ledger.Deposited(account, n), ctx)
            ctx.flush()
            # One statement: the first batch's rows are all opened in it (set, then added
            # to: set), the second's all only added to.
            assert _inserts(conn) - before == 1
    with db.read() as conn:
        rows = ledger.read_model(conn.execute(select(ledger.balances)).mappings())
    expected = ledger.replay(
        [ledger.AccountOpened(f"acct-{n:02d}", "ada") for n in range(40)]
        + [ledger.Deposited(f"acct-{n % 40:02d}", n) for n in range(40, 200)]
        + [ledger.Deposited(f"acct-{n % 40:02d}", n) for n in range(200)]
    )
    assert rows == expected
