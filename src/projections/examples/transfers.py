"""The ledger's transfers as a saga: debit, then credit, or refund when not approved in time.

A client appends ``TransferRequested`` to the ``transfers`` topic. The ``ledger-transfers``
saga sends ``DebitAccount`` to the ``ledger-accounts`` destination and schedules a
deadline. Transfers up to :data:`APPROVAL_LIMIT` are approved at once; larger ones wait
for a ``TransferApproved``. Once debited and approved, the saga sends ``CreditAccount``;
if the deadline comes before the approval, it sends ``RefundAccount`` instead. Either
way it ends by sending a ``Notify`` to ``ledger-notifications``.

The outcome does not depend on timing: an approval is appended to the transfer's own
source, so it lands in the partition of the saga's deadline, and a partition's messages
are applied before its due deadlines. Whatever the load, crashes or handovers, the
balances are those of a sequential run (:func:`model`).

The ``ledger-accounts`` route consumer turns commands into ledger events of the account
(``TransferDebited``/``Credited``/``Refunded``, which the balances projection applies);
it and the notifications consumer are idempotent: a command sent twice has effect once.

Run it beside the ledger: ``projections run projections.examples.ledger
projections.examples.transfers``; ``projections demo`` does.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import attrs
from sqlalchemy import Column, MetaData, String, Table, insert

from messaging import HandlerContext, handler, message, route_consumer
from projections.examples.ledger import (
    TOPIC,
    AccountOpened,
    Deposited,
    TransferCredited,
    TransferDebited,
    TransferRefunded,
    replay,
)
from sagas import SagaContext, saga, start

TRANSFERS = "transfers"
ACCOUNTS = "ledger-accounts"
NOTIFICATIONS = "ledger-notifications"
APPROVAL_LIMIT = 300
"""Transfers above this amount wait for a ``TransferApproved``."""
TRANSFER_TIMEOUT = 2.0
"""Seconds a transfer may take before it is refunded (short, for the demo)."""


@message("transfers.requested")
@attrs.define(frozen=True)
class TransferRequested:
    transfer_id: str
    from_account: str
    to_account: str
    amount: int


@message("transfers.approved")
@attrs.define(frozen=True)
class TransferApproved:
    transfer_id: str


@message("transfers.expired")
@attrs.define(frozen=True)
class TransferExpired:
    """The saga's deadline."""

    transfer_id: str


@message("accounts.debit")
@attrs.define(frozen=True)
class DebitAccount:
    account_id: str
    transfer_id: str
    amount: int


@message("accounts.credit")
@attrs.define(frozen=True)
class CreditAccount:
    account_id: str
    transfer_id: str
    amount: int


@message("accounts.refund")
@attrs.define(frozen=True)
class RefundAccount:
    account_id: str
    transfer_id: str
    amount: int


@message("notifications.notify")
@attrs.define(frozen=True)
class Notify:
    account_id: str
    transfer_id: str
    text: str


@attrs.define
class Transfer:
    """A transfer saga's state."""

    from_account: str
    to_account: str
    amount: int
    approved: bool
    stage: str = "debiting"
    """debiting → debited → crediting or refunding."""
    expired: bool = False


@saga(
    "ledger-transfers",
    topics=(TRANSFERS, TOPIC),
    correlate_by="transfer_id",
    state=Transfer,
    partitions=8,
)
class TransferSaga:
    """Moves money between two accounts in steps, and gives it back if it takes too long."""

    @start
    def requested(self, event: TransferRequested, ctx: SagaContext) -> None:
        if ctx.state is not None:
            return  # a request appended twice: the transfer is under way already
        ctx.state = Transfer(
            from_account=event.from_account,
            to_account=event.to_account,
            amount=event.amount,
            approved=event.amount <= APPROVAL_LIMIT,
        )
        ctx.send(
            ACCOUNTS,
            DebitAccount(event.from_account, ctx.key, event.amount),
            key=event.from_account,
        )
        ctx.schedule(TransferExpired(ctx.key), after=TRANSFER_TIMEOUT)

    @handler
    def approved(self, event: TransferApproved, ctx: SagaContext) -> None:
        if ctx.state.expired or ctx.state.stage == "refunding":
            return  # too late: the transfer is being refunded
        ctx.state.approved = True
        if ctx.state.stage == "debited":
            self._credit(ctx)

    @handler
    def debited(self, event: TransferDebited, ctx: SagaContext) -> None:
        ctx.state.stage = "debited"
        if ctx.state.expired:
            self._refund(ctx)
        elif ctx.state.approved:
            self._credit(ctx)

    @handler
    def expired(self, event: TransferExpired, ctx: SagaContext) -> None:
        if ctx.state.approved:
            return  # the deadline only bounds the wait for an approval
        if ctx.state.stage == "debiting":
            ctx.state.expired = True  # refunded once the debit is through
        else:
            self._refund(ctx)

    @handler
    def credited(self, event: TransferCredited, ctx: SagaContext) -> None:
        self._notify(ctx, f"sent {ctx.state.amount} to {ctx.state.to_account}")
        ctx.end()

    @handler
    def refunded(self, event: TransferRefunded, ctx: SagaContext) -> None:
        self._notify(ctx, f"transfer of {ctx.state.amount} not approved in time; refunded")
        ctx.end()

    @staticmethod
    def _credit(ctx: SagaContext) -> None:
        state = ctx.state
        state.stage = "crediting"
        ctx.cancel(TransferExpired)
        ctx.send(
            ACCOUNTS, CreditAccount(state.to_account, ctx.key, state.amount), key=state.to_account
        )

    @staticmethod
    def _refund(ctx: SagaContext) -> None:
        state = ctx.state
        state.stage = "refunding"
        ctx.send(
            ACCOUNTS,
            RefundAccount(state.from_account, ctx.key, state.amount),
            key=state.from_account,
        )

    @staticmethod
    def _notify(ctx: SagaContext, text: str) -> None:
        account = ctx.state.from_account
        ctx.send(NOTIFICATIONS, Notify(account, ctx.key, text), key=account)


@route_consumer(ACCOUNTS, partitions=8, idempotent=True)
class Accounts:
    """Carries out account commands as ledger events of the account (once per command id)."""

    @handler
    def debit(self, command: DebitAccount, ctx: HandlerContext) -> None:
        ctx.append(
            TOPIC,
            command.account_id,
            TransferDebited(command.account_id, command.transfer_id, command.amount),
        )

    @handler
    def credit(self, command: CreditAccount, ctx: HandlerContext) -> None:
        ctx.append(
            TOPIC,
            command.account_id,
            TransferCredited(command.account_id, command.transfer_id, command.amount),
        )

    @handler
    def refund(self, command: RefundAccount, ctx: HandlerContext) -> None:
        ctx.append(
            TOPIC,
            command.account_id,
            TransferRefunded(command.account_id, command.transfer_id, command.amount),
        )


metadata = MetaData()
notifications = Table(
    "ledger_notifications",
    metadata,
    Column("transfer_id", String(64), primary_key=True),
    Column("account_id", String(64), nullable=False),
    Column("text", String(200), nullable=False),
)


@route_consumer(NOTIFICATIONS, partitions=4, idempotent=True, tables=[notifications])
class Notifications:
    """Keeps every account holder's notifications (a stand-in for sending them)."""

    @handler
    def notify(self, command: Notify, ctx: HandlerContext) -> None:
        ctx.execute(
            insert(notifications),
            {
                "transfer_id": command.transfer_id,
                "account_id": command.account_id,
                "text": command.text,
            },
        )


def traffic(
    seed: int, count: int, accounts: int = 20, prefix: str = "xfer"
) -> Iterator[list[tuple[str, str, object]]]:
    """About ``count`` transfer requests as (topic, source, message) commands, after the
    accounts are opened and funded. Some large transfers are approved at once (appended
    with the request), the others never are, and are refunded at their deadline."""
    rng = random.Random(seed)
    names = [f"{prefix}-{i:04d}" for i in range(accounts)]
    available = {}
    for name in names:
        available[name] = 10_000
        yield [(TOPIC, name, AccountOpened(name, "saga")), (TOPIC, name, Deposited(name, 10_000))]
    for number in range(count):
        source, target = rng.sample(names, 2)
        if available[source] == 0:
            continue
        amount = rng.randint(1, min(available[source], 2 * APPROVAL_LIMIT))
        available[source] -= amount  # refunds and credits are not counted on: never negative
        transfer_id = f"{prefix}-t{number:06d}"
        command: list[tuple[str, str, object]] = [
            (TRANSFERS, transfer_id, TransferRequested(transfer_id, source, target, amount))
        ]
        if amount > APPROVAL_LIMIT and rng.random() < 0.5:
            command.append((TRANSFERS, transfer_id, TransferApproved(transfer_id)))
        yield command


def model(messages: Iterable[object]) -> dict[str, tuple[str, int, int]]:
    """The balances a sequential run of the traffic ends with: every approved transfer
    debited and credited, every other one debited and refunded (approvals come with their
    requests in :func:`traffic`, before any deadline)."""
    messages = list(messages)
    approved = {m.transfer_id for m in messages if isinstance(m, TransferApproved)}
    events: list[object] = []
    for m in messages:
        if not isinstance(m, TransferRequested):
            events.append(m)
            continue
        events.append(TransferDebited(m.from_account, m.transfer_id, m.amount))
        if m.amount <= APPROVAL_LIMIT or m.transfer_id in approved:
            events.append(TransferCredited(m.to_account, m.transfer_id, m.amount))
        else:
            events.append(TransferRefunded(m.from_account, m.transfer_id, m.amount))
    return replay(events)
