"""``GET /metrics`` of the admin server: OpenTelemetry's Prometheus exporter, set up when an
admin server starts (``run --admin-port``, ``projections admin``) with the plugin enabled.

When the application has set no meter provider of its own, the plugin sets the global one:
an SDK provider whose only reader is a ``PrometheusMetricReader`` (the instruments of
:data:`~projections_otel.telemetry.default_telemetry` record to it from then on). When
the application set one, it is kept: ``/metrics`` then shows what the Prometheus
readers it registered collect (add one to your provider). The exporter comes with the
``otel`` extra (``pip install 'projections[otel]'``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from opentelemetry import metrics

from messaging import hookimpl
from projections_otel.telemetry import default_telemetry

log = logging.getLogger(__name__)

_installed: bool | None = None
"""Whether ``/metrics`` has an exporter behind it (None: not tried yet)."""
_installing = threading.Lock()


def install_prometheus() -> bool:
    """Make the metrics readable by :func:`exposition` (once); False when the exporter is
    not installed."""
    global _installed
    with _installing:
        if _installed is not None:
            return _installed
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
        except ImportError:
            log.warning(
                "projections_otel: GET /metrics needs the Prometheus exporter: "
                "pip install 'projections[otel]'"
            )
            _installed = False
            return False
        if isinstance(metrics.get_meter_provider(), MeterProvider):
            log.info(
                "projections_otel: the application set its own meter provider; GET /metrics "
                "shows what its PrometheusMetricReader collects"
            )
        else:
            metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
        _installed = True
        return True


def exposition() -> tuple[bytes, str] | None:
    """The metrics in the Prometheus text format, and its content type (None when
    :func:`install_prometheus` did not succeed)."""
    if not _installed:
        return None
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


@hookimpl
def projections_admin_started(
    tenant: str, instance_id: str | None, health: Callable[[], Mapping[str, str]]
) -> None:
    install_prometheus()
    default_telemetry.projections_admin_started(
        tenant=tenant, instance_id=instance_id, health=health
    )


@hookimpl
def projections_metrics_exposition() -> tuple[bytes, str] | None:
    return exposition()
