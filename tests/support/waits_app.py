"""A route consumer and a saga for the read-your-own-writes tests: each records what it
handled where a new connection can read it (a row; the saga's state). ``rw-deposits``
turns a deposit command into the ledger's event and a job, and keeps the token of both
in a receipt (what a web request reads to wait for what the command caused)."""

from __future__ import annotations

import attrs
from sqlalchemy import Column, MetaData, String, Table, Text, insert

from messaging import HandlerContext, TokenNotKnown, handler, message, route_consumer
from projections.examples import ledger
from sagas import SagaContext, saga, start

metadata = MetaData()
jobs = Table("rw_jobs_done", metadata, Column("job_id", String(64), primary_key=True))
receipts = Table(
    "rw_receipts",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("token", Text, nullable=False),
    Column("before_flush", Text, nullable=False),
)


@message("test-waits-app.job")
@attrs.define(frozen=True)
class Job:
    job_id: str


@route_consumer("rw-jobs", partitions=4, tables=[jobs])
class Jobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        ctx.execute(insert(jobs), {"job_id": job.job_id})


@message("test-waits-app.deposit")
@attrs.define(frozen=True)
class Deposit:
    request_id: str
    account: str
    amount: int


@route_consumer("rw-deposits", partitions=2, tables=[receipts])
class Deposits:
    @handler
    def deposit(self, command: Deposit, ctx: HandlerContext) -> None:
        event = ledger.Deposited(command.account, command.amount)
        appended = ctx.append(ledger.TOPIC, command.account, event)
        sent = ctx.send("rw-jobs", Job(f"after-{command.request_id}"))
        try:
            before = str(appended.token)
        except TokenNotKnown as exc:
            before = str(exc)
        ctx.flush()  # the positions: the tokens are known from here
        ctx.execute(
            insert(receipts),
            {
                "request_id": command.request_id,
                "token": str(appended.token | sent.token),
                "before_flush": before,
            },
        )


@message("test-waits-app.opened")
@attrs.define(frozen=True)
class Opened:
    counter_id: str


@message("test-waits-app.bumped")
@attrs.define(frozen=True)
class Bumped:
    counter_id: str


@attrs.define
class Count:
    bumps: int = 0


@saga("rw-counters", topics="counters", correlate_by="counter_id", state=Count, partitions=4)
class Counters:
    @start
    def opened(self, event: Opened, ctx: SagaContext) -> None:
        ctx.state = Count()

    @handler
    def bumped(self, event: Bumped, ctx: SagaContext) -> None:
        ctx.state.bumps += 1
