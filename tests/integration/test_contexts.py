"""One handler-context protocol: a helper written against ``MessageContext`` runs in a route
consumer's handler (``HandlerContext``) and in a saga's (``SagaContext``), and what it sends
and appends, headers included, commits with the batch on both."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from clusters import manual_clock_database

from messaging import (
    Database,
    MessageContext,
    MessageStore,
    handler,
    message,
    route_consumer,
    upcaster,
)
from messaging._config import settings_from_mapping
from projections.testing import SimulatedCluster
from sagas import SagaContext, saga, start

SETTINGS = settings_from_mapping({"messaging": {"consumer": {"batch-size": 50}}})


@message("test-ctx.job")
@attrs.define(frozen=True)
class Job:
    job_id: str


@message("test-ctx.done", version=2)
@attrs.define(frozen=True)
class Done:
    """At payload version 2: what a handler sends or appends is stored at that version."""

    job_id: str


@upcaster("test-ctx.done", 1)
def _done_v1(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def announce(ctx: MessageContext, job_id: str, by: str) -> None:
    """Send ``Done`` to ``test-ctx-done`` and append it to ``test-ctx-log``, tagged ``by``."""
    ctx.send("test-ctx-done", Done(job_id), key=job_id, headers={"by": by})
    ctx.append("test-ctx-log", job_id, Done(job_id), headers={"by": by})


@route_consumer("test-ctx-jobs", partitions=2)
class Jobs:
    @handler
    def job(self, command: Job, ctx: MessageContext) -> None:
        announce(ctx, command.job_id, "route")


@attrs.define
class JobState:
    seen: int = 0


@saga("test-ctx-saga", topics="test-ctx-events", correlate_by="job_id", state=JobState)
class JobSaga:
    @start
    def job(self, event: Job, ctx: SagaContext) -> None:
        ctx.state = JobState(seen=1)
        announce(ctx, f"saga-{ctx.key}", "saga")


@pytest.fixture
def cluster(database_url: str, table_prefix: str) -> SimulatedCluster:
    return SimulatedCluster(
        manual_clock_database(database_url, table_prefix), [Jobs, JobSaga], SETTINGS
    )


def _stored(db: Database, topic: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(source, job id, headers) of every message in ``topic``, each stored at payload
    version 2 (``Done``'s)."""
    with db.read() as conn:
        rows = MessageStore(db).read(conn, [topic], limit=100)
    assert [row.payload_version for row in rows] == [2] * len(rows)
    return [
        (
            row.source,
            json.loads(row.payload)["job_id"],
            json.loads(row.headers) if isinstance(row.headers, str) else dict(row.headers),
        )
        for row in rows
    ]


def test_one_helper_sends_and_appends_with_headers_from_both_kinds_of_context(
    cluster: SimulatedCluster,
) -> None:
    cluster.join("a")
    store = MessageStore(cluster.db)
    with cluster.db.transaction() as conn:
        store.send(conn, "test-ctx-jobs", Job("j1"), key="j1")
        store.append(conn, "test-ctx-events", "src-1", [Job("k1")])
    while cluster.poll_all():
        pass
    sent = sorted(_stored(cluster.db, "test-ctx-done"), key=lambda m: m[1])
    assert [(s, j, h["by"]) for s, j, h in sent] == [
        ("j1", "j1", "route"),
        ("saga-k1", "saga-k1", "saga"),
    ]
    assert all(h["message-id"] for _, _, h in sent)  # the framework's header is kept
    appended = sorted(_stored(cluster.db, "test-ctx-log"), key=lambda m: m[1])
    assert appended == [("j1", "j1", {"by": "route"}), ("saga-k1", "saga-k1", {"by": "saga"})]


def test_sagas_context_extends_the_handler_context_protocol() -> None:
    """SagaContext is a MessageContext with the same signatures, plus the saga's own."""
    import inspect

    from messaging import HandlerContext

    assert MessageContext in SagaContext.__mro__ and MessageContext in HandlerContext.__mro__
    for name in ("execute", "send", "append"):
        assert inspect.signature(getattr(SagaContext, name)) == inspect.signature(
            getattr(HandlerContext, name)
        ), name
    assert {"end", "schedule", "cancel"} <= set(dir(SagaContext)) - set(dir(HandlerContext))
