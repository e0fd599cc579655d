"""A route consumer and a saga for the read-your-own-writes tests: each records what it
handled where a new connection can read it (a row; the saga's state)."""

from __future__ import annotations

import attrs
from sqlalchemy import Column, MetaData, String, Table, insert

from messaging import HandlerContext, handler, message, route_consumer
from sagas import SagaContext, saga, start

metadata = MetaData()
jobs = Table("rw_jobs_done", metadata, Column("job_id", String(64), primary_key=True))


@message("test-waits-app.job")
@attrs.define(frozen=True)
class Job:
    job_id: str


@route_consumer("rw-jobs", partitions=4, tables=[jobs])
class Jobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        ctx.execute(insert(jobs), {"job_id": job.job_id})


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
