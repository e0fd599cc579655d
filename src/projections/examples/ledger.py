"""The ledger example: accounts, deposits, withdrawals and transfers, and two projections.

Every account is a source on the ``ledger`` topic, so all of an account's messages
fall in one partition and arrive in order. A transfer is two messages, one on each
account, appended in one transaction: each partition only ever touches its own
account's row.

Run it with ``projections run projections.examples.ledger``; ``projections demo``
writes traffic, runs it and checks the read model against a sequential replay.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
)

from messaging import HandlerContext, handler, message
from projections import in_memory_projection, projection

TOPIC = "ledger"


@message("ledger.account-opened")
@attrs.define(frozen=True)
class AccountOpened:
    account_id: str
    owner: str


@message("ledger.deposited")
@attrs.define(frozen=True)
class Deposited:
    account_id: str
    amount: int


@message("ledger.withdrawn")
@attrs.define(frozen=True)
class Withdrawn:
    account_id: str
    amount: int


@message("ledger.transfer-sent")
@attrs.define(frozen=True)
class TransferSent:
    account_id: str
    to_account: str
    amount: int


@message("ledger.transfer-received")
@attrs.define(frozen=True)
class TransferReceived:
    account_id: str
    from_account: str
    amount: int


@message("ledger.transfer-debited")
@attrs.define(frozen=True)
class TransferDebited:
    """The first leg of a transfer run by the transfer saga (``projections.examples.transfers``)."""

    account_id: str
    transfer_id: str
    amount: int


@message("ledger.transfer-credited")
@attrs.define(frozen=True)
class TransferCredited:
    account_id: str
    transfer_id: str
    amount: int


@message("ledger.transfer-refunded")
@attrs.define(frozen=True)
class TransferRefunded:
    account_id: str
    transfer_id: str
    amount: int


metadata = MetaData()
balances = Table(
    "ledger_balances",
    metadata,
    Column("account_id", String(64), primary_key=True),
    Column("owner", String(200), nullable=False),
    Column("balance", BigInteger, nullable=False),
    Column("entries", Integer, nullable=False),
)

NO_OWNER = {"owner": ""}
"""What an account changed before it was opened gets as its owner (it never happens in this
example's traffic, but the column is NOT NULL)."""


@projection("ledger-balances", topics=TOPIC, partitions=8, tables=[balances])
class Balances:
    """Each account's balance and number of entries, in the ``ledger_balances`` table.

    Every handler upserts the account's row itself: a batch's changes to one account are folded
    into one row, and all of them are sent as one multi-row statement per batch instead of
    one round trip per message.
    """

    @handler
    def opened(self, event: AccountOpened, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            set={"owner": event.owner, "balance": 0, "entries": 0},
        )

    @handler
    def deposited(self, event: Deposited, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": event.amount, "entries": 1},
            insert=NO_OWNER,
        )

    @handler
    def withdrawn(self, event: Withdrawn, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": -event.amount, "entries": 1},
            insert=NO_OWNER,
        )

    @handler
    def sent(self, event: TransferSent, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": -event.amount, "entries": 1},
            insert=NO_OWNER,
        )

    @handler
    def received(self, event: TransferReceived, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": event.amount, "entries": 1},
            insert=NO_OWNER,
        )

    @handler
    def debited(self, event: TransferDebited, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": -event.amount, "entries": 1},
            insert=NO_OWNER,
        )

    @handler
    def credited(self, event: TransferCredited, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": event.amount, "entries": 1},
            insert=NO_OWNER,
        )

    @handler
    def refunded(self, event: TransferRefunded, ctx: HandlerContext) -> None:
        ctx.upsert(
            balances,
            {"account_id": event.account_id},
            add={"balance": event.amount, "entries": 1},
            insert=NO_OWNER,
        )


@in_memory_projection("ledger-activity", topics=TOPIC)
class Activity:
    """How many messages of each kind this process has seen, and the money moved."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.moved = 0

    @handler
    def opened(self, event: AccountOpened) -> None:
        self.counts["opened"] += 1

    @handler
    def deposited(self, event: Deposited) -> None:
        self.counts["deposited"] += 1
        self.moved += event.amount

    @handler
    def withdrawn(self, event: Withdrawn) -> None:
        self.counts["withdrawn"] += 1
        self.moved += event.amount

    @handler
    def sent(self, event: TransferSent) -> None:
        self.counts["transfers"] += 1
        self.moved += event.amount


_DELTA_SIGN: dict[type, int] = {
    Deposited: 1,
    Withdrawn: -1,
    TransferSent: -1,
    TransferReceived: 1,
    TransferDebited: -1,
    TransferCredited: 1,
    TransferRefunded: 1,
}


def replay(messages: Iterable[object]) -> dict[str, tuple[str, int, int]]:
    """Balances by sequential replay of ``messages`` (other kinds of messages are passed
    over): account → (owner, balance, entries)."""
    state: dict[str, list[Any]] = {}
    for event in messages:
        if isinstance(event, AccountOpened):
            state[event.account_id] = [event.owner, 0, 0]
            continue
        sign = _DELTA_SIGN.get(type(event))
        if sign is None:
            continue
        row = state[event.account_id]  # type: ignore[attr-defined]
        row[1] += sign * event.amount  # type: ignore[attr-defined]
        row[2] += 1
    return {account: (row[0], row[1], row[2]) for account, row in state.items()}


def read_model(rows: Iterable[Any]) -> dict[str, tuple[str, int, int]]:
    """The balances table as the same mapping :func:`replay` returns."""
    return {r["account_id"]: (r["owner"], int(r["balance"]), int(r["entries"])) for r in rows}


def traffic(
    seed: int, count: int, accounts: int = 200, prefix: str = "acct"
) -> Iterator[list[tuple[str, object]]]:
    """A realistic stream of about ``count`` messages, as commands of (source, message) lists.

    Up to ``accounts`` accounts are opened as the traffic goes; each command's messages
    belong in one transaction (a transfer is two). Balances never go below zero.
    """
    rng = random.Random(seed)
    balance: dict[str, int] = {}
    opened: list[str] = []
    owners = ("ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal")
    produced = 0
    while produced < count:
        command: list[tuple[str, object]]
        if len(opened) < accounts and (len(opened) < 2 or rng.random() < 0.05):
            account = f"{prefix}-{len(opened):05d}"
            opened.append(account)
            balance[account] = 0
            command = [(account, AccountOpened(account, rng.choice(owners)))]
        else:
            account = rng.choice(opened)
            roll = rng.random()
            if roll < 0.5 or balance[account] == 0:
                amount = rng.randint(1, 500)
                balance[account] += amount
                command = [(account, Deposited(account, amount))]
            elif roll < 0.8:
                amount = rng.randint(1, balance[account])
                balance[account] -= amount
                command = [(account, Withdrawn(account, amount))]
            else:
                other = rng.choice(opened)
                if other == account:
                    continue
                amount = rng.randint(1, balance[account])
                balance[account] -= amount
                balance[other] += amount
                command = [
                    (account, TransferSent(account, other, amount)),
                    (other, TransferReceived(other, account, amount)),
                ]
        produced += len(command)
        yield command
