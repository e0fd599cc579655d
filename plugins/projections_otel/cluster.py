"""The cluster's metrics: which instance owns what share of each consumer (the reference's
range gauges), the partitioned fetches, and the consumers' health verdicts; and the
attributes every metric carries (the instance's name and its tenant)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.util.types import Attributes

from messaging import Verdict, hookimpl

log = logging.getLogger(__name__)

NOT_CONTIGUOUS = -1
"""What the range gauges read while a member's partitions of a consumer are not one
contiguous range (its share still says how many it owns)."""


def contiguous_range(partitions: Sequence[int]) -> tuple[int, int]:
    """``partitions`` as one half-open range ``(start, end)``: ``(0, 0)`` for none, as the
    reference's gauges read for an absent member; :data:`NOT_CONTIGUOUS` twice for a set
    with a gap."""
    if not partitions:
        return 0, 0
    low, high = min(partitions), max(partitions)
    if high - low + 1 != len(set(partitions)):
        return NOT_CONTIGUOUS, NOT_CONTIGUOUS
    return low, high + 1


class ClusterMetrics:
    """The members' names and tenants, the ownership gauges, the partitioned fetches and
    the health verdicts (a state set: one series per consumer and verdict, 1 for the
    consumer's verdict and 0 for the others)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._names: dict[str, str] = {}
        self._tenants: dict[str, str] = {}
        self._health: tuple[str, Callable[[], Mapping[str, str]]] | None = None
        self._lock = threading.Lock()
        self.share = meter.create_gauge(
            "projections.partition.share",
            unit="1",
            description="Share of a consumer's partitions this member owns (0 to 1)",
        )
        self.range_start = meter.create_gauge(
            "projections.partition.range.start",
            unit="{partition}",
            description="First partition of this member's contiguous range [start, end) "
            "(0 with none, -1 when not contiguous)",
        )
        self.range_end = meter.create_gauge(
            "projections.partition.range.end",
            unit="{partition}",
            description="End (exclusive) of this member's contiguous range [start, end) "
            "(0 with none, -1 when not contiguous)",
        )
        self.fetches = meter.create_counter(
            "projections.partitioned.fetches",
            unit="{fetch}",
            description="Reads of the partitions this member owns (empty ones included)",
        )
        self.fetched = meter.create_counter(
            "projections.partitioned.fetched",
            unit="{message}",
            description="Messages those reads brought",
        )
        meter.create_observable_gauge(
            "projections.consumer.health",
            callbacks=[self._observe_health],
            unit="{verdict}",
            description="1 for a consumer's current health verdict, 0 for the others",
        )

    def _instance(self, instance_id: str) -> str:
        """The instance's name when it started here, else its id."""
        return self._names.get(instance_id, instance_id)

    def _who(self, instance_id: str) -> dict[str, str]:
        """The attributes of every metric about ``instance_id``: its name and tenant."""
        return {
            "instance": self._instance(instance_id),
            "tenant": self._tenants.get(instance_id, ""),
        }

    def _observe_health(self, options: CallbackOptions) -> Iterable[Observation]:
        """Each consumer's verdict, asked of the admin server's health source now."""
        if self._health is None:
            return []
        tenant, verdicts = self._health
        try:
            current = verdicts()
        except Exception as exc:  # the database fails: no verdict rather than an old one
            log.warning("projections_otel: no health verdicts: %s", str(exc).splitlines()[0])
            return []
        return [
            Observation(
                int(verdict == value),
                {"consumer": consumer, "verdict": value.value, "tenant": tenant},
            )
            for consumer, verdict in sorted(current.items())
            for value in Verdict
        ]

    @hookimpl
    def projections_instance_started(
        self, instance_id: str, name: str, consumers: Sequence[str], tenant: str
    ) -> None:
        with self._lock:
            self._names[instance_id] = name
            self._tenants[instance_id] = tenant

    @hookimpl
    def projections_admin_started(
        self, tenant: str, instance_id: str | None, health: Callable[[], Mapping[str, str]]
    ) -> None:
        self._health = (tenant, health)

    def _ownership(
        self, consumer: str, instance_id: str, partitions: Sequence[int], total: int
    ) -> None:
        attributes: Attributes = {
            "consumer": consumer,
            "member": instance_id,
            **self._who(instance_id),
        }
        self.share.set(len(partitions) / total if total else 0.0, attributes)
        start, end = contiguous_range(partitions)
        self.range_start.set(start, attributes)
        self.range_end.set(end, attributes)

    def _batch_read(self, consumer: str, instance_id: str, count: int) -> None:
        attributes: Attributes = {"consumer": consumer, **self._who(instance_id)}
        self.fetches.add(1, attributes)
        self.fetched.add(count, attributes)
