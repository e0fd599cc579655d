"""Every hook the framework calls, in one place. Hook names carry the ``projections_`` prefix.

Implement them in any plugin: an application module named on the command line, an
installed package registered under the ``projections`` entry-point group, or an
object passed to :func:`messaging._plugins.create_plugin_manager`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pluggy

hookspec = pluggy.HookspecMarker("projections")
hookimpl = pluggy.HookimplMarker("projections")


# -------------------------------------------------------------------------------------
# Collection: which consumers an instance runs
# -------------------------------------------------------------------------------------


@hookspec
def projections_consumers() -> Sequence[type]:
    """Return consumer classes (marked by a consumer kind's decorator) to run.

    Called once at start. The built-in plugin returns the decorated classes defined in
    the application modules; other plugins may contribute their own. Duplicate
    consumer names across all results fail the start.
    """
    raise NotImplementedError


# -------------------------------------------------------------------------------------
# Lifecycle events: called from the runtime's threads; must be quick and must not raise
# -------------------------------------------------------------------------------------


@hookspec
def projections_instance_started(
    instance_id: str, name: str, consumers: Sequence[str], tenant: str
) -> None:
    """Called after an instance of ``tenant`` registered itself and before it applies
    anything."""


@hookspec
def projections_instance_stopping(instance_id: str, name: str) -> None:
    """Called when an instance begins a graceful stop, before it finishes work in flight."""


@hookspec
def projections_partition_claimed(
    consumer: str, partition: int, epoch: int, instance_id: str
) -> None:
    """Called after this instance claimed a partition under a new epoch."""


@hookspec
def projections_partition_released(consumer: str, partition: int, instance_id: str) -> None:
    """Called after this instance released a partition (or learnt that it lost it)."""


@hookspec
def projections_batch_applied(
    consumer: str,
    partitions: Sequence[int],
    epochs: Mapping[int, int],
    instance_id: str,
    count: int,
    last_position: int,
    seconds: float,
) -> None:
    """Called after a batch of ``count`` messages committed with the checkpoints of
    ``partitions`` (each under its epoch in ``epochs``) by ``instance_id``."""


@hookspec
def projections_message_failed(
    consumer: str,
    partition: int,
    position: int,
    type_name: str,
    error: BaseException,
    instance_id: str,
) -> None:
    """Called when a message could not be decoded or handled on ``instance_id``."""


@hookspec
def projections_partition_halted(
    consumer: str, partition: int, position: int, type_name: str, error: str, instance_id: str
) -> None:
    """Called after ``instance_id`` halted a partition at a poison message (recorded in the
    database)."""


@hookspec
def projections_source_parked(
    consumer: str, partition: int, source: str, position: int, type_name: str, instance_id: str
) -> None:
    """Called after ``instance_id`` parked ``source`` of a partition at a failing message
    (``on-failure: park-source``; recorded in the database)."""


@hookspec
def projections_source_retried(
    consumer: str, partition: int, source: str, applied: int, instance_id: str
) -> None:
    """Called after ``instance_id`` applied the ``applied`` held messages of a parked
    ``source`` an operator retried (committed)."""


@hookspec
def projections_retrying(what: str, instance_id: str, error: BaseException) -> None:
    """Called before ``instance_id`` retries ``what`` after a transient database error
    (``conflict-retry``)."""


@hookspec
def projections_lock_contention(what: str, instance_id: str, kind: str) -> None:
    """Called before ``instance_id`` retries ``what`` after a lock conflict, right after
    :func:`projections_retrying`. ``kind`` is ``"busy"`` or ``"locked"`` (SQLite: another
    process held the database lock beyond the busy timeout), ``"lock-wait-timeout"`` or
    ``"deadlock"`` (MySQL)."""


# -------------------------------------------------------------------------------------
# Measurements: timings and gauges of the distribution protocol, for telemetry plugins
# -------------------------------------------------------------------------------------


@hookspec
def projections_heartbeat(instance_id: str, seconds: float) -> None:
    """Called after each heartbeat write, with how long it took."""


@hookspec
def projections_rebalanced(
    instance_id: str,
    seconds: float,
    membership_seconds: float,
    live_members: int,
    claimed: int,
    released: int,
) -> None:
    """Called after each rebalance round: its duration, how long reading the membership
    and ownership rows took, how many live members it saw, and what it moved here."""


@hookspec
def projections_versions(
    instance_id: str, live: Mapping[str, int], building: Mapping[str, int]
) -> None:
    """Called after each rebalance round with the projections this instance runs: the
    number of each one's live version, and of the version being built beside it (those
    building one only). A building version's progress is the lag of its partitions
    (:func:`projections_lag`, consumer ``name@N``)."""


@hookspec
def projections_ownership(
    consumer: str, instance_id: str, partitions: Sequence[int], total: int
) -> None:
    """Called after each rebalance round, for each consumer applied here, with the
    partitions this instance owns of the ``total``."""


@hookspec
def projections_batch_read(
    consumer: str, instance_id: str, partitions: Sequence[int], count: int
) -> None:
    """Called after each read of the partitions this instance owns (the reference's
    "partitioned fetch"), with how many messages it brought (0: nothing to apply)."""


@hookspec
def projections_lag(consumer: str, instance_id: str, lags: Mapping[int, int]) -> None:
    """Called after each rebalance round with the position lag of each partition applied
    here: the newest position in the store minus the partition's checkpoint."""


# -------------------------------------------------------------------------------------
# Admin server: health for telemetry, the Prometheus scrape endpoint
# -------------------------------------------------------------------------------------


@hookspec
def projections_admin_started(
    tenant: str, instance_id: str | None, health: Callable[[], Mapping[str, str]]
) -> None:
    """Called when an admin server starts (before the instance beside it, if any,
    starts): ``health()`` gives each consumer's health verdict now (it queries the
    database; it raises while the database fails), for telemetry plugins to observe."""


@hookspec(firstresult=True)
def projections_metrics_exposition() -> tuple[bytes, str] | None:
    """The metrics in the Prometheus text format and its content type, for ``GET
    /metrics`` of the admin server; None from a plugin that exports none."""
