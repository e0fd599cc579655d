"""What the read-your-own-writes tests share: the ledger's instance in this process, a
deposit with its token, an account's row as a new connection reads it, and the admin's
long poll for a token."""

from __future__ import annotations

from urllib.parse import quote

from sqlalchemy import select

from messaging import (
    Appended,
    Database,
    Instance,
    MessageStore,
    Settings,
    collect_consumers,
    create_plugin_manager,
)
from projections.examples import ledger

CONSUMER = "ledger-balances"


def ledger_instance(db: Database, name: str = "rw") -> Instance:
    """An instance of the ledger app on ``db`` at the default settings (not started)."""
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    return Instance(db, collect_consumers(manager), Settings(), manager.hook, name=name)


def deposit(db: Database, account: str, amount: int = 1) -> Appended:
    """Deposit ``amount`` to ``account`` in a transaction of its own; its positions and token."""
    with db.transaction() as conn:
        return MessageStore(db).append(
            conn, ledger.TOPIC, account, [ledger.Deposited(account, amount)]
        )


def wait_url(base: str, token: object, timeout: str = "10", consumer: str = CONSUMER) -> str:
    """The admin server's long poll (at ``base``) until ``consumer`` applied ``token``."""
    return f"{base}/admin/consumers/{consumer}/wait?token={quote(str(token))}&timeout={timeout}"


def _column(db: Database, account: str, column: str) -> int | None:
    table = db.read_model(ledger.balances)
    with db.read() as conn:
        value = conn.execute(
            select(table.c[column]).where(table.c.account_id == account)
        ).scalar_one_or_none()
    return None if value is None else int(value)


def entries(db: Database, account: str) -> int:
    """The account's entries, read on a new connection (0: no row yet)."""
    return _column(db, account, "entries") or 0


def balance(db: Database, account: str) -> int | None:
    """The account's balance, read on a new connection (None: no row yet)."""
    return _column(db, account, "balance")
