"""The engine's seam for the operator tools built on it: the CLI, the admin server, the
reports and the testing kit (``projections``).

What they read and change of a tenant's cluster in the database (members, partitions
and their owners, versions of consumers, parked sources, the generation), how a one-shot
command retries, the schema's migrations, and running instances (the ``--workers``
supervisor, stop signals, probes, lifecycle events). An application needs none of it:
its names are in :mod:`messaging`.
"""

from messaging._bounds import lock_wait_bound
from messaging._config import ADMIN_TOKEN_ENV, parse_duration, settings_from_mapping
from messaging._connection import database_for
from messaging._consumers import collect_specs
from messaging._errors import unknown_consumer
from messaging._kinds import kind_named
from messaging._lifecycle import lifecycle_event
from messaging._messages import MESSAGE_ID_HEADER, registry
from messaging._overrides import check_overrides
from messaging._plugins import import_module
from messaging._settings import format_duration
from messaging._states import ConsumerState, OwnerState, PartitionStatus
from messaging.distribution._membership import InstanceRow, Membership, stale_of
from messaging.distribution._needs import describe as describe_need
from messaging.distribution._needs import pending_need
from messaging.distribution._ownership import NOT_HALTED, Ownership
from messaging.distribution._pulse import bump_generation
from messaging.failures._parking import PARKED, RETRYING, RETRYING_SKIPPED
from messaging.routing._consumer import ROUTE_CONSUMER
from messaging.runtime._probes import DatabaseCheck, liveness, readiness
from messaging.runtime._refreshed import Reading, Refreshed
from messaging.runtime._signals import POLL, StopSignals
from messaging.runtime._supervisor import Supervisor
from messaging.store._clock import ManualClock
from messaging.store._committed import append_committed
from messaging.store._database import parse_database_url
from messaging.store._ddl import drop_tables_if_exist
from messaging.store._liveness import STALE
from messaging.store._migrations import migrate
from messaging.store._refusals import refusal, refusal_words, refused_writes
from messaging.store._retry import for_command, retry_command
from messaging.store._rows import PARTITION_HASH
from messaging.store._table_registry import removed_owner
from messaging.versions._retired import NoRetiredVersion, delete_version_rows, revive
from messaging.versions._versions import (
    UnitRow,
    cutting_over,
    seconds_now,
    split_unit,
    unit_rows,
    versions_changing,
)
from messaging.waits._progress import check_consumers
from messaging.waits._waits import Waiter, check_timeout

__all__ = [
    "ADMIN_TOKEN_ENV",
    "MESSAGE_ID_HEADER",
    "NOT_HALTED",
    "PARKED",
    "PARTITION_HASH",
    "POLL",
    "RETRYING",
    "RETRYING_SKIPPED",
    "ROUTE_CONSUMER",
    "STALE",
    "ConsumerState",
    "DatabaseCheck",
    "InstanceRow",
    "ManualClock",
    "Membership",
    "NoRetiredVersion",
    "OwnerState",
    "Ownership",
    "PartitionStatus",
    "Reading",
    "Refreshed",
    "StopSignals",
    "Supervisor",
    "UnitRow",
    "Waiter",
    "append_committed",
    "bump_generation",
    "check_consumers",
    "check_overrides",
    "check_timeout",
    "collect_specs",
    "cutting_over",
    "database_for",
    "delete_version_rows",
    "describe_need",
    "drop_tables_if_exist",
    "for_command",
    "format_duration",
    "import_module",
    "kind_named",
    "lifecycle_event",
    "liveness",
    "lock_wait_bound",
    "migrate",
    "parse_database_url",
    "parse_duration",
    "pending_need",
    "readiness",
    "refusal",
    "refusal_words",
    "refused_writes",
    "registry",
    "removed_owner",
    "retry_command",
    "revive",
    "seconds_now",
    "settings_from_mapping",
    "split_unit",
    "stale_of",
    "unit_rows",
    "unknown_consumer",
    "versions_changing",
]
