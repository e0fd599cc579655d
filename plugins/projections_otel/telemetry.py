"""The plugin object: hook implementations that record OpenTelemetry metrics and spans."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import metrics, trace
from opentelemetry.util.types import Attributes

from messaging import hookimpl
from projections_otel.cluster import ClusterMetrics

INSTRUMENTATION_NAME = "projections_otel"
_VERSION = "0.1.0"

log = logging.getLogger(__name__)

DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Bucket boundaries (seconds) the duration histograms advise, from 1 ms to 30 s: the SDK's
default ones (0, 5, 10, ... 10,000) would put every sub-second batch in one bucket. A View
of the application's own still wins."""


_RECORDING = threading.Lock()
"""Hooks fire from several threads at once (one per batch lane); the SDK can lose the first
measurements of a new attribute set when they race, so recording goes one at a time."""


@contextmanager
def _never_raise(hook: str) -> Iterator[None]:
    """Lifecycle hooks run on the runtime's threads and must not raise: log and go on."""
    try:
        with _RECORDING:
            yield
    except Exception:
        log.exception("projections_otel: %s failed; telemetry skipped", hook)


class Telemetry(ClusterMetrics):
    """A plugin recording metrics and batch spans from the projections lifecycle hooks.

    :param meter_provider: Where the instruments come from; the global provider if None.
    :param tracer_provider: Where the spans go; the global provider if None.

    With the global providers the instruments are proxies until the application sets
    the providers, so the object may be created before that (the module-level
    :data:`default_telemetry` is).
    """

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        meter = metrics.get_meter(INSTRUMENTATION_NAME, _VERSION, meter_provider=meter_provider)
        super().__init__(meter)
        self.tracer = trace.get_tracer(
            INSTRUMENTATION_NAME, _VERSION, tracer_provider=tracer_provider
        )
        self.messages_applied = meter.create_counter(
            "projections.messages.applied",
            unit="{message}",
            description="Messages applied and committed, by consumer",
        )
        self.batch_duration = meter.create_histogram(
            "projections.batch.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            description="Time to read, apply and commit one batch",
        )
        self.checkpoint_position = meter.create_gauge(
            "projections.checkpoint.position",
            unit="{position}",
            description="Last position applied by a consumer on this instance",
        )
        self.claims = meter.create_counter(
            "projections.partition.claims",
            unit="{claim}",
            description="Partitions claimed by this instance under a new epoch",
        )
        self.moves = meter.create_counter(
            "projections.partition.moves",
            unit="{move}",
            description="Partitions claimed here that another instance held before (epoch > 1)",
        )
        self.releases = meter.create_counter(
            "projections.partition.releases",
            unit="{release}",
            description="Partitions released (or lost) by this instance",
        )
        self.failures = meter.create_counter(
            "projections.message.failures",
            unit="{message}",
            description="Messages that could not be decoded or handled",
        )
        self.halts = meter.create_counter(
            "projections.partition.halts",
            unit="{halt}",
            description="Partitions halted at a poison message",
        )
        self.parks = meter.create_counter(
            "projections.source.parks",
            unit="{source}",
            description="Sources parked at a failing message (on-failure: park-source)",
        )
        self.retried = meter.create_counter(
            "projections.source.retried",
            unit="{message}",
            description="Held messages of parked sources applied by a retry",
        )
        self.retries = meter.create_counter(
            "projections.retries",
            unit="{retry}",
            description="Transient database errors retried",
        )
        self.lock_contentions = meter.create_counter(
            "projections.lock.contentions",
            unit="{conflict}",
            description="Lock conflicts met and retried (SQLite busy, MySQL lock wait or deadlock)",
        )
        self.deadlines_delivered = meter.create_counter(
            "projections.deadlines.delivered",
            unit="{deadline}",
            description="Saga deadlines delivered and committed",
        )
        self.deadline_lateness = meter.create_histogram(
            "projections.deadline.lateness",
            unit="s",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            description="Time from a saga deadline's due time to its delivery",
        )
        self.heartbeat_duration = meter.create_histogram(
            "projections.heartbeat.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            description="Time to write one heartbeat",
        )
        self.rebalance_duration = meter.create_histogram(
            "projections.rebalance.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            description="Time of one rebalance round",
        )
        self.membership_read_duration = meter.create_histogram(
            "projections.membership.read.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            description="Time to read the membership and ownership rows of a round",
        )
        self.live_members = meter.create_gauge(
            "projections.members.live",
            unit="{instance}",
            description="Live instances seen by this instance's last rebalance",
        )
        self.lag = meter.create_gauge(
            "projections.partition.lag",
            unit="{position}",
            description="Newest position in the store minus the partition's checkpoint",
        )
        self.live_version = meter.create_gauge(
            "projections.version.live",
            unit="{version}",
            description="The number of a projection's live version",
        )
        self.building_version = meter.create_gauge(
            "projections.version.building",
            unit="{version}",
            description="The number of the version being built beside the live one (0: none)",
        )
        self._building: set[str] = set()
        self._positions: dict[tuple[str, str], int] = {}

    # -- hooks -------------------------------------------------------------------------

    @hookimpl
    def projections_instance_stopping(self, instance_id: str, name: str) -> None:
        # Keep the name: releases and the last batches still arrive while it stops.
        return None

    @hookimpl
    def projections_partition_claimed(
        self, consumer: str, partition: int, epoch: int, instance_id: str
    ) -> None:
        with _never_raise("projections_partition_claimed"):
            attributes: Attributes = {
                "consumer": consumer,
                "partition": partition,
                **self._who(instance_id),
            }
            self.claims.add(1, attributes)
            if epoch > 1:  # the partition was owned before: it moved here
                self.moves.add(1, attributes)

    @hookimpl
    def projections_partition_released(
        self, consumer: str, partition: int, instance_id: str
    ) -> None:
        with _never_raise("projections_partition_released"):
            self.releases.add(
                1,
                {
                    "consumer": consumer,
                    "partition": partition,
                    **self._who(instance_id),
                },
            )

    @hookimpl
    def projections_batch_applied(
        self,
        consumer: str,
        partitions: Sequence[int],
        epochs: Mapping[int, int],
        instance_id: str,
        count: int,
        last_position: int,
        seconds: float,
    ) -> None:
        with _never_raise("projections_batch_applied"):
            end = time.time_ns()
            who = self._who(instance_id)
            attributes: Attributes = {"consumer": consumer, **who}
            self.messages_applied.add(count, attributes)
            self.batch_duration.record(seconds, attributes)
            # Lanes commit in parallel: report the highest position applied so far.
            key = (consumer, instance_id)
            self._positions[key] = max(self._positions.get(key, 0), last_position)
            self.checkpoint_position.set(self._positions[key], attributes)
            span = self.tracer.start_span(
                "projections.batch",
                kind=trace.SpanKind.CONSUMER,
                start_time=end - max(0, int(seconds * 1e9)),
                attributes={
                    "consumer": consumer,
                    "count": count,
                    "last_position": last_position,
                    "partitions": list(partitions),
                    **who,
                },
            )
            span.end(end_time=end)

    @hookimpl
    def projections_message_failed(
        self,
        consumer: str,
        partition: int,
        position: int,
        type_name: str,
        error: BaseException,
        instance_id: str,
    ) -> None:
        with _never_raise("projections_message_failed"):
            self.failures.add(
                1,
                {
                    "consumer": consumer,
                    "partition": partition,
                    "type": type_name,
                    "error.type": type(error).__name__,
                    **self._who(instance_id),
                },
            )

    @hookimpl
    def projections_partition_halted(
        self, consumer: str, partition: int, position: int, type_name: str, instance_id: str
    ) -> None:
        with _never_raise("projections_partition_halted"):
            self.halts.add(
                1,
                {
                    "consumer": consumer,
                    "partition": partition,
                    "type": type_name,
                    **self._who(instance_id),
                },
            )

    @hookimpl
    def projections_source_parked(
        self, consumer: str, partition: int, type_name: str, instance_id: str
    ) -> None:
        with _never_raise("projections_source_parked"):
            who = self._who(instance_id)
            self.parks.add(
                1,
                {
                    "consumer": consumer,
                    "partition": partition,
                    "type": type_name,
                    **who,
                },
            )

    @hookimpl
    def projections_source_retried(
        self, consumer: str, partition: int, applied: int, instance_id: str
    ) -> None:
        with _never_raise("projections_source_retried"):
            who = self._who(instance_id)
            self.retried.add(applied, {"consumer": consumer, "partition": partition, **who})

    @hookimpl
    def projections_retrying(self, what: str, instance_id: str, error: BaseException) -> None:
        with _never_raise("projections_retrying"):
            self.retries.add(
                1,
                {
                    "what": what,
                    "error.type": type(error).__name__,
                    **self._who(instance_id),
                },
            )

    @hookimpl
    def projections_lock_contention(self, what: str, instance_id: str, kind: str) -> None:
        with _never_raise("projections_lock_contention"):
            self.lock_contentions.add(1, {"what": what, "kind": kind, **self._who(instance_id)})

    @hookimpl(optionalhook=True)  # specified by sagas, when imported
    def projections_deadlines_delivered(
        self, consumer: str, instance_id: str, count: int, lateness: Sequence[float]
    ) -> None:
        with _never_raise("projections_deadlines_delivered"):
            attributes: Attributes = {"consumer": consumer, **self._who(instance_id)}
            self.deadlines_delivered.add(count, attributes)
            for seconds in lateness:
                self.deadline_lateness.record(seconds, attributes)

    @hookimpl
    def projections_heartbeat(self, instance_id: str, seconds: float) -> None:
        with _never_raise("projections_heartbeat"):
            self.heartbeat_duration.record(seconds, self._who(instance_id))

    @hookimpl
    def projections_rebalanced(
        self, instance_id: str, seconds: float, membership_seconds: float, live_members: int
    ) -> None:
        with _never_raise("projections_rebalanced"):
            attributes: Attributes = self._who(instance_id)
            self.rebalance_duration.record(seconds, attributes)
            self.membership_read_duration.record(membership_seconds, attributes)
            self.live_members.set(live_members, attributes)

    @hookimpl
    def projections_versions(
        self, instance_id: str, live: Mapping[str, int], building: Mapping[str, int]
    ) -> None:
        with _never_raise("projections_versions"):
            who = self._who(instance_id)
            for name, version in live.items():
                self.live_version.set(version, {"consumer": name, **who})
            for name in self._building | set(building):  # 0 once a build is over
                attributes: Attributes = {"consumer": name, **who}
                self.building_version.set(building.get(name, 0), attributes)
            self._building = set(building)

    @hookimpl
    def projections_ownership(
        self, consumer: str, instance_id: str, partitions: Sequence[int], total: int
    ) -> None:
        with _never_raise("projections_ownership"):
            self._ownership(consumer, instance_id, partitions, total)

    @hookimpl
    def projections_batch_read(
        self, consumer: str, instance_id: str, partitions: Sequence[int], count: int
    ) -> None:
        with _never_raise("projections_batch_read"):
            self._batch_read(consumer, instance_id, count)

    @hookimpl
    def projections_lag(self, consumer: str, instance_id: str, lags: Mapping[int, int]) -> None:
        with _never_raise("projections_lag"):
            who = self._who(instance_id)
            for partition, lag in lags.items():
                self.lag.set(lag, {"consumer": consumer, "partition": partition, **who})


default_telemetry = Telemetry()
"""The instance behind ``plugins: [projections_otel]``: records to the global providers."""

# ``plugins: [projections_otel]`` registers the module: pluggy finds these (marked bound
# methods of the default instance) as the module's hook implementations.
projections_instance_started = default_telemetry.projections_instance_started
projections_instance_stopping = default_telemetry.projections_instance_stopping
projections_partition_claimed = default_telemetry.projections_partition_claimed
projections_partition_released = default_telemetry.projections_partition_released
projections_batch_applied = default_telemetry.projections_batch_applied
projections_message_failed = default_telemetry.projections_message_failed
projections_partition_halted = default_telemetry.projections_partition_halted
projections_retrying = default_telemetry.projections_retrying
projections_source_parked = default_telemetry.projections_source_parked
projections_source_retried = default_telemetry.projections_source_retried
projections_lock_contention = default_telemetry.projections_lock_contention
projections_deadlines_delivered = default_telemetry.projections_deadlines_delivered
projections_heartbeat = default_telemetry.projections_heartbeat
projections_rebalanced = default_telemetry.projections_rebalanced
projections_lag = default_telemetry.projections_lag
projections_versions = default_telemetry.projections_versions
projections_ownership = default_telemetry.projections_ownership
projections_batch_read = default_telemetry.projections_batch_read
