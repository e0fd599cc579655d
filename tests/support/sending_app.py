"""A projection that sends, for the rebuild tests: ``sending`` records each numbered
message in ``sending_seen`` and sends one job per message to the route consumer
``sending-jobs`` (not idempotent), which records each job it runs in ``sending_done``. A
job run twice shows as a repeated ``job_id``; a rebuild must send nothing again."""

from __future__ import annotations

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from messaging import HandlerContext, handler, message, route_consumer
from projections import projection

TOPIC = "sending"
JOBS = "sending-jobs"
CONSUMER = "sending"

metadata = MetaData()
seen = Table(
    "sending_seen",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
)
done = Table(
    "sending_done",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
)


@message("test.sending.numbered")
@attrs.define(frozen=True)
class Numbered:
    source: str
    seq: int


@message("test.sending.job")
@attrs.define(frozen=True)
class Job:
    job_id: str


@projection(CONSUMER, topics=TOPIC, partitions=4, tables=[seen])
class Sending:
    @handler
    def numbered(self, event: Numbered, ctx: HandlerContext) -> None:
        ctx.execute(insert(seen), {"source": event.source, "seq": event.seq})
        ctx.send(JOBS, Job(f"{event.source}:{event.seq}"), key=event.source)


@route_consumer(JOBS, partitions=2, tables=[done])
class Jobs:
    @handler
    def run(self, job: Job, ctx: HandlerContext) -> None:
        ctx.execute(insert(done), {"job_id": job.job_id})
