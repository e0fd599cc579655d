"""OpenTelemetry metrics and traces for projections, built on the public hooks alone.

Enable it in the YAML config; ``projections run`` registers the module as a plugin and
it records through the *global* meter and tracer providers, which the application (or
the OpenTelemetry SDK's auto-configuration) sets::

    plugins: [projections_otel]

In process, or with providers of your own (tests), register a :class:`Telemetry`
object instead::

    telemetry = Telemetry(meter_provider=meter_provider, tracer_provider=tracer_provider)
    manager = create_plugin_manager(["myapp"], plugins=[telemetry])

Metrics (attributes ``consumer``, ``partition`` where one applies, ``instance``, the
instance's name):

=====================================  ===============  ===========================
name                                   instrument       from hook
=====================================  ===============  ===========================
``projections.messages.applied``       counter          projections_batch_applied
``projections.batch.duration``         histogram (s)    projections_batch_applied
``projections.checkpoint.position``    gauge            projections_batch_applied
``projections.partition.claims``       counter          projections_partition_claimed
``projections.partition.moves``        counter          projections_partition_claimed
``projections.partition.releases``     counter          projections_partition_released
``projections.message.failures``       counter          projections_message_failed
``projections.partition.halts``        counter          projections_partition_halted
``projections.source.parks``           counter          projections_source_parked
``projections.source.retried``         counter          projections_source_retried
``projections.retries``                counter          projections_retrying
``projections.lock.contentions``       counter          projections_lock_contention
``projections.deadlines.delivered``    counter          projections_deadlines_delivered
``projections.deadline.lateness``      histogram (s)    projections_deadlines_delivered
``projections.heartbeat.duration``     histogram (s)    projections_heartbeat
``projections.rebalance.duration``     histogram (s)    projections_rebalanced
``projections.membership.read.duration`` histogram (s)  projections_rebalanced
``projections.members.live``           gauge            projections_rebalanced
``projections.partition.lag``          gauge            projections_lag
``projections.version.live``           gauge            projections_versions
``projections.version.building``       gauge            projections_versions
``projections.partition.share``        gauge (0-1)      projections_ownership
``projections.partition.range.start``  gauge            projections_ownership
``projections.partition.range.end``    gauge            projections_ownership
``projections.partitioned.fetches``    counter          projections_batch_read
``projections.partitioned.fetched``    counter          projections_batch_read
``projections.consumer.health``        observable gauge projections_admin_started
=====================================  ===============  ===========================

Every metric also carries ``tenant``. The ownership gauges are the reference's range
gauges: per consumer and ``member`` (the instance's id), the share of the consumer's
partitions it owns and its range ``[start, end)`` (0 and 0 while it owns none, -1 and -1
while its partitions are not one contiguous range). ``projections.partitioned.fetches``
counts the reads of the owned partitions, empty ones included (``...fetched``: the
messages they brought). ``projections.consumer.health`` is a state set: one series per
consumer and ``verdict`` (every verdict of ``projections health``), 1 for the
consumer's current verdict and 0 for the others; it is read from the database when
collected, through an admin server's health source (``run --admin-port``, ``projections
admin``), so an instance without one reports none.

An admin server with the plugin enabled serves ``GET /metrics`` for Prometheus
(:mod:`projections_otel.prometheus`): with no meter provider set by the application,
the plugin sets one exporting through OpenTelemetry's Prometheus exporter.

A version being built beside the live one is the consumer ``name@N`` in the metrics of
its batches, claims and lag (its build progress: its partitions' lag going to 0);
``projections.version.building`` is its number while it is built, 0 after.

The histograms (all durations, in seconds) advise the bucket boundaries
:data:`DURATION_BUCKETS`, 1 ms to 30 s (the SDK's default ones go from 0 to 10,000 in
steps too coarse for sub-second times); a View of the application's own still wins.

``projections.message.failures`` and ``projections.partition.halts`` also carry
``type`` (the message type); ``projections.retries`` carries ``what`` (what was being
done) and ``error.type``; ``projections.lock.contentions`` carries ``what`` and
``kind`` (``busy``/``locked`` on SQLite, ``lock-wait-timeout``/``deadlock`` on MySQL).

Traces: a ``projections.batch`` span per applied batch, with attributes ``consumer``,
``count``, ``last_position``, ``partitions`` and ``instance``. The hook fires after the
commit, so the span is recorded afterwards with its start set ``seconds`` back.

Trace context from the appender to the handler travels in the message headers (W3C
``traceparent``/``tracestate`` and ``baggage``)::

    from projections_otel import context_of, trace_headers

    # appending, inside the caller's span:
    with tracer.start_as_current_span("open account"):
        with db.transaction() as conn:
            store.append(conn, "ledger", "acct-1", [opened], headers=trace_headers())

    # in a handler: a child span of the appender's span
    @handler
    def opened(self, event: AccountOpened, ctx: HandlerContext) -> None:
        with tracer.start_as_current_span("apply opened", context=context_of(ctx.envelope)):
            ...

Merge with headers of your own as ``headers={**trace_headers(), "correlation": ...}``.
"""

from __future__ import annotations

from projections_otel.cluster import NOT_CONTIGUOUS, ClusterMetrics, contiguous_range
from projections_otel.prometheus import (
    exposition,
    install_prometheus,
    projections_admin_started,
    projections_metrics_exposition,
)
from projections_otel.propagation import context_of, trace_headers
from projections_otel.telemetry import (
    DURATION_BUCKETS,
    INSTRUMENTATION_NAME,
    Telemetry,
    default_telemetry,
    projections_batch_applied,
    projections_batch_read,
    projections_deadlines_delivered,
    projections_heartbeat,
    projections_instance_started,
    projections_instance_stopping,
    projections_lag,
    projections_lock_contention,
    projections_message_failed,
    projections_ownership,
    projections_partition_claimed,
    projections_partition_halted,
    projections_partition_released,
    projections_rebalanced,
    projections_retrying,
    projections_source_parked,
    projections_source_retried,
    projections_versions,
)

__all__ = [
    "DURATION_BUCKETS",
    "INSTRUMENTATION_NAME",
    "NOT_CONTIGUOUS",
    "ClusterMetrics",
    "Telemetry",
    "context_of",
    "contiguous_range",
    "default_telemetry",
    "exposition",
    "install_prometheus",
    "projections_admin_started",
    "projections_batch_applied",
    "projections_batch_read",
    "projections_deadlines_delivered",
    "projections_heartbeat",
    "projections_instance_started",
    "projections_instance_stopping",
    "projections_lag",
    "projections_lock_contention",
    "projections_message_failed",
    "projections_metrics_exposition",
    "projections_ownership",
    "projections_partition_claimed",
    "projections_partition_halted",
    "projections_partition_released",
    "projections_rebalanced",
    "projections_retrying",
    "projections_source_parked",
    "projections_source_retried",
    "projections_versions",
    "trace_headers",
]
