"""The typed settings tree (the YAML file's sections, README "Configuration") and the
start-up rules that check it.

Every class here is a frozen, keyword-only attrs class whose defaults are the
documented defaults. Durations are ``float`` seconds. YAML names are the field
names in kebab-case (``rebalance_interval`` is ``rebalance-interval``); see
:mod:`messaging._config` for loading them from a file.
"""

from __future__ import annotations

import enum
import math
import re
from decimal import Decimal

import attrs

from messaging._bounds import LOCK_WAIT_FRACTION, lock_wait_bound
from messaging._errors import ConfigError
from messaging._kinds import registered_kinds

__all__ = [
    "AdminSettings",
    "ConflictRetrySettings",
    "ConsumerGroupSettings",
    "ConsumerOverride",
    "ConsumerSettings",
    "Distribution",
    "ExecutorSettings",
    "HealthSettings",
    "InvalidSettings",
    "MessagingSettings",
    "OnFailure",
    "Settings",
    "consumer_sections",
    "format_duration",
    "validate",
]


class Distribution(enum.Enum):
    """How a consumer's partitions are spread over the live instances."""

    #: Partitions are balanced over all live instances.
    PARTITIONED = "partitioned"
    #: One elected instance owns every partition and applies in global order.
    SINGLE_OWNER = "single-owner"


class OnFailure(enum.Enum):
    """What a message that cannot be decoded or handled (after its retries) does."""

    #: Halt its partition at it until an operator resumes it.
    HALT_PARTITION = "halt-partition"
    #: Set it and every later message of its source aside, in order; the rest goes on.
    PARK_SOURCE = "park-source"


@attrs.frozen(kw_only=True)
class ExecutorSettings:
    """The thread pool that applies batches.

    :ivar max_workers: Upper bound on worker threads (``max-workers``).
    """

    max_workers: int = 8


@attrs.frozen(kw_only=True)
class ConflictRetrySettings:
    """Capped exponential backoff for transient database errors (lock waits, deadlocks, busy).

    :ivar max_retries: Retries after the first attempt; 0 disables retrying (``max-retries``).
    :ivar max_delay: Cap on a single backoff delay, in seconds (``max-delay``).
    """

    max_retries: int = 5
    max_delay: float = 1.0


@attrs.frozen(kw_only=True)
class ConsumerSettings:
    """Timings and sizes of the consumer loops (heartbeat, rebalance, apply).

    :ivar rebalance_interval: Seconds between rebalances.
    :ivar stale_instance_timeout: Seconds without a heartbeat after which an instance is dead.
    :ivar graceful_shutdown_timeout: Seconds a clean stop may spend finishing work in flight.
    :ivar heartbeat_interval: Seconds between heartbeats.
    :ivar batch_size: Messages fetched and committed at once.
    :ivar idle_poll_interval: Seconds to wait after an empty fetch.
    :ivar executor: The apply thread pool.
    :ivar conflict_retry: Backoff for transient database errors.
    """

    rebalance_interval: float = 10.0
    stale_instance_timeout: float = 30.0
    graceful_shutdown_timeout: float = 20.0
    heartbeat_interval: float = 5.0
    batch_size: int = 500
    idle_poll_interval: float = 0.2
    executor: ExecutorSettings = attrs.field(factory=ExecutorSettings)
    conflict_retry: ConflictRetrySettings = attrs.field(factory=ConflictRetrySettings)


@attrs.frozen(kw_only=True)
class MessagingSettings:
    """The ``messaging`` section: settings shared by every kind of consumer.

    :ivar consumer: Loop timings and sizes.
    :ivar gc_freeze: Whether the process moves every object it holds to Python's
        permanent garbage-collector generation when its first instance starts and when a
        worker first applied a batch (``gc-freeze``; see :mod:`messaging.runtime._heap`).
    """

    consumer: ConsumerSettings = attrs.field(factory=ConsumerSettings)
    gc_freeze: bool = True


@attrs.frozen(kw_only=True)
class ConsumerOverride:
    """Per-consumer settings that win over the group's; ``None`` means "use the group's".

    :ivar distribution: Distribution mode for this consumer only.
    :ivar concurrency_limit: Most partitions of this consumer applied at once
        in one instance (``concurrency-limit``); ``None`` means no limit.
    :ivar retired_versions: Retired versions of this projection to keep (for a rollback).
    :ivar on_failure: What a failing message does to this consumer (``on-failure``).
    :ivar apply_timeout: Seconds one batch of this consumer may take (``apply-timeout``).
    :ivar batch_size: Messages (or deadlines) this consumer fetches and commits at once
        (``batch-size``), instead of ``messaging.consumer.batch-size``: a smaller batch
        for a route consumer with slow side effects bounds what a crash repeats.
    """

    distribution: Distribution | None = None
    concurrency_limit: int | None = None
    retired_versions: int | None = None
    on_failure: OnFailure | None = None
    apply_timeout: float | None = None
    batch_size: int | None = None


@attrs.frozen(kw_only=True)
class ConsumerGroupSettings:
    """The settings section of a kind of consumer (its ``ConsumerKind.settings_group``).

    :ivar distribution: Default distribution mode of every consumer in the group.
    :ivar retired_versions: How many versions a cutover retired each projection keeps,
        latest first, with their tables (``retired-versions``): a rollback goes back to
        the latest; older ones are dropped after each cutover. 0 keeps none.
    :ivar consumers: Overrides by consumer name.
    :ivar on_failure: What a failing message does (``on-failure``); ``None``: the kind's
        default (a single-owner consumer halts unless configured otherwise).
    :ivar max_parked_sources: Most parked sources per partition (``max-parked-sources``);
        one more failing source halts the partition instead.
    :ivar apply_timeout: Seconds one batch's transaction may take, from its first handler
        call to its commit (``apply-timeout``): past it the batch is rolled back (a running
        statement interrupted) and the message being handled fails like a poison message
        (halt or park, as ``on-failure`` says). 5 minutes, like Kafka's
        ``max.poll.interval.ms``: far above any sane batch, it only ends stuck ones.
    """

    distribution: Distribution = Distribution.PARTITIONED
    retired_versions: int = 1
    consumers: dict[str, ConsumerOverride] = attrs.field(factory=dict)
    on_failure: OnFailure | None = None
    max_parked_sources: int = 100
    apply_timeout: float = 300.0

    def apply_timeout_for(self, name: str) -> float:
        """Seconds one batch of consumer ``name`` may take: its override, else the group's."""
        override = self.consumers.get(name)
        if override is not None and override.apply_timeout is not None:
            return override.apply_timeout
        return self.apply_timeout

    def consumer_settings_for(self, name: str, shared: ConsumerSettings) -> ConsumerSettings:
        """The loop settings of consumer ``name``: ``shared`` (``messaging.consumer``) with
        its own ``batch-size``, if it has one."""
        override = self.consumers.get(name)
        if override is None or override.batch_size is None:
            return shared
        return attrs.evolve(shared, batch_size=override.batch_size)

    def on_failure_for(self, name: str, default: OnFailure) -> OnFailure:
        """What a failure does to consumer ``name``: its override, else the group's
        setting, else ``default`` (the kind's), except that a single-owner consumer halts
        unless configured otherwise (it promises one order across sources)."""
        override = self.consumers.get(name)
        if override is not None and override.on_failure is not None:
            return override.on_failure
        if self.on_failure is not None:
            return self.on_failure
        if self.distribution_for(name) is Distribution.SINGLE_OWNER:
            return OnFailure.HALT_PARTITION
        return default

    def distribution_for(self, name: str) -> Distribution:
        """The distribution mode of consumer ``name``: its override, else the group default."""
        override = self.consumers.get(name)
        if override is not None and override.distribution is not None:
            return override.distribution
        return self.distribution

    def retired_versions_for(self, name: str) -> int:
        """How many retired versions projection ``name`` keeps."""
        override = self.consumers.get(name)
        if override is not None and override.retired_versions is not None:
            return override.retired_versions
        return self.retired_versions

    def concurrency_limit_for(self, name: str) -> int | None:
        """The concurrency limit of consumer ``name``, or ``None`` when it has none."""
        override = self.consumers.get(name)
        return override.concurrency_limit if override is not None else None


@attrs.frozen(kw_only=True)
class AdminSettings:
    """The ``admin`` section: who may use the admin server (``projections admin``,
    ``run --admin-port``).

    :ivar token: The bearer token every state-changing request must send
        (``Authorization: Bearer <token>``); ``None`` disables those requests.
        ``$PROJECTIONS_ADMIN_TOKEN`` wins over the file. Never shown in a repr or an error.
    :ivar allowed_hosts: Extra names a request's ``Host`` header may give (``allowed-hosts``),
        e.g. a reverse proxy's; ``name`` matches on any port, ``name:port`` on that one.
    """

    token: str | None = attrs.field(default=None, repr=False)
    allowed_hosts: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class HealthSettings:
    """The ``health`` section: when a partition's verdict turns from ``lagging`` to
    ``stalled`` (``projections health``, ``GET /admin/health``).

    :ivar stall_timeout: Seconds a partition may have messages to apply and commit no
        checkpoint before it is ``stalled`` (``stall-timeout``).
    """

    stall_timeout: float = 30.0


def consumer_sections() -> list[str]:
    """The settings sections of the registered consumer kinds (their ``settings_group``),
    sorted: the top-level keys a file may use besides those of :class:`Settings`."""
    return sorted({kind.settings_group for kind in registered_kinds()})


@attrs.frozen(kw_only=True)
class Settings:
    """The whole configuration of one deployment.

    :ivar database: SQLAlchemy URL of the shared database.
    :ivar tenant: Rows and instances of other tenants in the same database are invisible;
        read models are the tenant's own tables (``<tenant>__<name>`` unless ``default``).
    :ivar table_prefix: Prefix of every table name (``table-prefix``).
    :ivar messaging: Settings shared by every consumer.
    :ivar plugins: Modules to load as plugins beside the application's (e.g. telemetry).
    :ivar admin: Access to the admin server.
    :ivar health: The thresholds of the health verdicts.
    :ivar consumer_groups: The configured sections of the consumer kinds, by section name
        (``projections``, ``routing``, ``sagas``, ... as the registered kinds name them;
        top-level keys in a file). :meth:`group` gives the defaults of one not configured.
    """

    database: str = "sqlite:///projections.db"
    tenant: str = "default"
    table_prefix: str = "prj_"
    messaging: MessagingSettings = attrs.field(factory=MessagingSettings)
    plugins: tuple[str, ...] = ()
    admin: AdminSettings = attrs.field(factory=AdminSettings)
    health: HealthSettings = attrs.field(factory=HealthSettings)
    consumer_groups: dict[str, ConsumerGroupSettings] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        """Settings built in code obey the same start-up rules as a YAML file."""
        validate(self)

    def group(self, section: str) -> ConsumerGroupSettings:
        """The settings of the consumer kinds configured under ``section``."""
        return self.consumer_groups.get(section) or ConsumerGroupSettings()


#: The shortest admin token accepted: shorter ones are guessable.
MIN_ADMIN_TOKEN_LENGTH = 16
_ADMIN_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: one header value
_ALLOWED_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_TABLE_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,20}")
_UNIT_SECONDS = (("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds: float) -> str:
    """Write ``seconds`` the way config files do: ``0.5`` → ``"500ms"``, ``10.0`` → ``"10s"``.

    Whole hours and minutes use ``h`` and ``m``, other whole seconds ``s``, anything
    below one second ``ms``. The result parses back to the same float.
    """
    if not math.isfinite(seconds):
        return f"{seconds}s"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds == 0:
        return "0s"
    exact = Decimal(repr(seconds))
    if exact < 1:
        return f"{(exact * 1000).normalize():f}ms"
    if exact == exact.to_integral_value():
        whole = int(exact)
        for unit, size in _UNIT_SECONDS:
            if whole % size == 0:
                return f"{whole // size}{unit}"
    return f"{exact.normalize():f}s"


def validate(settings: Settings) -> None:
    """Check the start-up rules; raise :class:`ConfigError` listing every broken one.

    Each line of the message names the setting by its YAML path.
    """
    problems = _problems(settings)
    if problems:
        raise InvalidSettings(problems)


class InvalidSettings(ConfigError):
    """Settings that break start-up rules; :attr:`problems` holds one line per broken rule."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


def _problems(settings: Settings) -> list[str]:
    problems: list[str] = []
    c = settings.messaging.consumer
    p = "messaging.consumer."
    d = format_duration

    durations = (
        ("rebalance-interval", c.rebalance_interval),
        ("stale-instance-timeout", c.stale_instance_timeout),
        ("graceful-shutdown-timeout", c.graceful_shutdown_timeout),
        ("heartbeat-interval", c.heartbeat_interval),
        ("idle-poll-interval", c.idle_poll_interval),
        ("conflict-retry.max-delay", c.conflict_retry.max_delay),
    )
    for key, value in durations:
        if not value > 0:
            problems.append(f"{p}{key} ({d(value)}) must be above 0s")

    if c.stale_instance_timeout < 1.0:
        problems.append(
            f"{p}stale-instance-timeout ({d(c.stale_instance_timeout)}) must be 1s or more"
        )
    if not c.rebalance_interval < c.stale_instance_timeout:
        problems.append(
            f"{p}rebalance-interval ({d(c.rebalance_interval)}) must be below "
            f"{p}stale-instance-timeout ({d(c.stale_instance_timeout)})"
        )
    if not c.heartbeat_interval < c.stale_instance_timeout / 2:
        problems.append(
            f"{p}heartbeat-interval ({d(c.heartbeat_interval)}) must be below half of "
            f"{p}stale-instance-timeout ({d(c.stale_instance_timeout)})"
        )
    retry = c.conflict_retry
    if not retry.max_delay < c.stale_instance_timeout:
        problems.append(
            f"{p}conflict-retry.max-delay ({d(retry.max_delay)}) must be below "
            f"{p}stale-instance-timeout ({d(c.stale_instance_timeout)})"
        )
    worst_case = retry.max_retries * retry.max_delay
    if not worst_case < c.graceful_shutdown_timeout:
        problems.append(
            f"{p}conflict-retry.max-retries ({retry.max_retries}) * "
            f"{p}conflict-retry.max-delay ({d(retry.max_delay)}) = {d(worst_case)} must be below "
            f"{p}graceful-shutdown-timeout ({d(c.graceful_shutdown_timeout)})"
        )

    if c.batch_size < 1:
        problems.append(f"{p}batch-size ({c.batch_size}) must be 1 or more")
    if c.executor.max_workers < 1:
        problems.append(f"{p}executor.max-workers ({c.executor.max_workers}) must be 1 or more")
    if retry.max_retries < 0:
        problems.append(f"{p}conflict-retry.max-retries ({retry.max_retries}) must be 0 or more")

    problems += group_problems(settings) + _health_problems(settings)

    if not settings.database.strip():
        problems.append("database must not be empty")
    if not settings.tenant.strip():
        problems.append("tenant must not be empty")
    if _TABLE_PREFIX.fullmatch(settings.table_prefix) is None:
        problems.append(
            f"table-prefix ({settings.table_prefix!r}) must be a letter or underscore followed "
            "by at most 20 letters, digits or underscores"
        )
    return problems + _admin_problems(settings.admin)


def _health_problems(settings: Settings) -> list[str]:
    """A stall timeout no longer than a batch may rightly go without a commit: retrying
    transient errors. (The idle-poll-interval does not count: new messages wake the
    workers at once.)"""
    c = settings.messaging.consumer
    stall, d, p = settings.health.stall_timeout, format_duration, "messaging.consumer."
    retrying = c.conflict_retry.max_retries * c.conflict_retry.max_delay
    if not stall > 0:
        return [f"health.stall-timeout ({d(stall)}) must be above 0s"]
    if not stall > retrying:
        return [
            f"health.stall-timeout ({d(stall)}) must be above {p}conflict-retry.max-retries "
            f"({c.conflict_retry.max_retries}) * {p}conflict-retry.max-delay "
            f"({d(c.conflict_retry.max_delay)}) = {d(retrying)}"
        ]
    return []


def _admin_problems(admin: AdminSettings) -> list[str]:
    problems: list[str] = []
    token = admin.token
    if token is not None:  # the token itself is never part of a message
        if len(token) < MIN_ADMIN_TOKEN_LENGTH:
            problems.append(
                f"admin.token must be at least {MIN_ADMIN_TOKEN_LENGTH} characters long "
                f"(it has {len(token)})"
            )
        elif _ADMIN_TOKEN.fullmatch(token) is None:
            problems.append("admin.token must be printable ASCII without spaces")
    for index, host in enumerate(admin.allowed_hosts):
        if _ALLOWED_HOST.fullmatch(host) is None:
            problems.append(
                f"admin.allowed-hosts.{index} ({host!r}) must be a host name or address, "
                "optionally with :port"
            )
    return problems


# -- the consumer kinds' sections (``projections``, ``routing``, ``sagas``...) ----------


def group_problems(settings: Settings) -> list[str]:
    """One line per problem of the consumer kinds' sections of ``settings``."""
    problems: list[str] = []
    sections = consumer_sections()
    no_limit = {
        kind.settings_group: kind.no_concurrency_limit
        for kind in registered_kinds()
        if kind.no_concurrency_limit
    }
    for section, group in sorted(settings.consumer_groups.items()):
        if group.max_parked_sources < 1:
            problems.append(
                f"{section}.max-parked-sources ({group.max_parked_sources}) must be 1 or more"
            )
        if section not in sections:
            problems.append(
                f"{section}: no consumer kind is configured under this section "
                f"(sections: {', '.join(sections)})"
            )
        parking = [k.value for k in registered_kinds() if k.settings_group == section and k.parks]
        chosen = [(f"{section}.on-failure", group.on_failure)] + [
            (f"{section}.consumers.{name}.on-failure", o.on_failure)
            for name, o in group.consumers.items()
        ]
        if section in sections and not parking:
            problems += [
                f"{key} (park-source) is not supported: {section} halt their partition on a failure"
                for key, value in chosen
                if value is OnFailure.PARK_SOURCE
            ]
        for name, override in group.consumers.items():
            limit = override.concurrency_limit
            key = f"{section}.consumers.{name}.concurrency-limit"
            if limit is not None and section in no_limit:
                problems.append(f"{key} ({limit}) is not supported: {no_limit[section]}")
            elif limit is not None and limit < 1:
                problems.append(f"{key} ({limit}) must be 1 or more")
            size = override.batch_size
            if size is not None and size < 1:
                problems.append(f"{section}.consumers.{name}.batch-size ({size}) must be 1 or more")
            kept = override.retired_versions
            if kept is not None and kept < 0:
                problems.append(
                    f"{section}.consumers.{name}.retired-versions ({kept}) must be 0 or more"
                )
        if group.retired_versions < 0:
            problems.append(
                f"{section}.retired-versions ({group.retired_versions}) must be 0 or more"
            )
        timeouts = [(f"{section}.apply-timeout", group.apply_timeout)] + [
            (f"{section}.consumers.{name}.apply-timeout", o.apply_timeout)
            for name, o in sorted(group.consumers.items())
        ]
        problems += [
            p
            for key, value in timeouts
            if value is not None
            for p in _apply_timeout(key, value, settings)
        ]
    return problems


def _apply_timeout(key: str, timeout: float, settings: Settings) -> list[str]:
    """An apply timeout must leave a batch time to wait out a lock held by a frozen
    instance (the lock-wait bound, which conflict-retry retries): a shorter one would halt
    partitions for a transient conflict. (A long batch never makes its instance or its
    partitions stale: the heartbeat runs apart, so there is no other bound.)"""
    d = format_duration
    if not timeout > 0:
        return [f"{key} ({d(timeout)}) must be above 0s"]
    stale = settings.messaging.consumer.stale_instance_timeout
    bound = lock_wait_bound(stale)
    if timeout > bound:
        return []
    return [
        f"{key} ({d(timeout)}) must be above the lock-wait bound: "
        f"messaging.consumer.stale-instance-timeout ({d(stale)}) / {LOCK_WAIT_FRACTION}, "
        f"at least 1s = {d(bound)}"
    ]
