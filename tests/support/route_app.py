"""A route consumer for real-process tests: each job leaves an effect outside the database
(a line in the file named by ``ROUTE_APP_EFFECTS``) and a row inside it."""

from __future__ import annotations

import os
import time

import attrs
from sqlalchemy import Column, MetaData, String, Table, insert

from messaging import HandlerContext, handler, message, route_consumer

metadata = MetaData()
jobs_done = Table(
    "test_jobs_done",
    metadata,
    Column("job_id", String(64), nullable=False),
)


@message("test-route-app.job")
@attrs.define(frozen=True)
class Job:
    job_id: str


@route_consumer("test-jobs", partitions=2, idempotent=True, tables=[jobs_done])
class Jobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        with open(os.environ["ROUTE_APP_EFFECTS"], "a", encoding="utf-8") as effects:
            effects.write(job.job_id + "\n")
        time.sleep(0.05)  # a slow side effect, so that a kill lands inside a batch
        ctx.execute(insert(jobs_done), {"job_id": job.job_id})
