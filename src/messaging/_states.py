"""Every state word the framework stores, reports or returns, as string enums.

Each member *is* its string (``enum.StrEnum``): stored columns, JSON reports and log
lines hold exactly the words below, and rows read back compare equal to the members.
"""

from __future__ import annotations

import enum

__all__ = [
    "ConsumerState",
    "CopyState",
    "DeclarationOutcome",
    "OwnerState",
    "PartitionStatus",
    "Severity",
    "Verdict",
]


class ConsumerState(enum.StrEnum):
    """A consumer's ``state`` column (the ``consumers`` table)."""

    RUNNING = "running"
    """Applying; its partitions may be claimed."""
    PAUSED = "paused"
    """An operator paused it: no partition is applied until ``resume``."""
    REBUILDING = "rebuilding"
    """Left by an older release's rebuild in place; taken as a rebuild request."""
    REBUILD_REQUESTED = "rebuild-requested"
    """An operator asked for a rebuild; the first instance running the consumer starts a
    new version of it (:mod:`messaging.versions._versions`)."""
    CUTTING_OVER = "cutting-over"
    """The live version stopped applying: a new version is taking its place."""
    RETIRED = "retired"
    """A version that is not live any more, or was replaced while being built."""


class PartitionStatus(enum.StrEnum):
    """A partition's ``status`` column (the ``partitions`` table)."""

    RUNNING = "running"
    HALTED = "halted"
    """A poison message stopped it; ``resume`` starts it again."""


class OwnerState(enum.StrEnum):
    """Who holds a partition, as the reports show it."""

    OWNED = "OWNED"
    """A live instance owns it."""
    ORPHANED = "ORPHANED"
    """Its owner is no longer live."""
    UNCLAIMED = "UNCLAIMED"
    """Nobody owns it."""


class CopyState(enum.StrEnum):
    """The state of one instance's copy of an in-memory consumer."""

    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    WAITING = "waiting"
    """At a payload newer than this instance's declarations: it applies nothing more."""


class DeclarationOutcome(enum.StrEnum):
    """What declaring a consumer did (``declare(...).outcome``)."""

    CREATED = "created"
    UNCHANGED = "unchanged"
    BUILDING = "building"
    """A new version of a projection is built under this declaration, beside the live one."""
    REDECLARED = "redeclared"
    """A consumer of a kind never rebuilt, under a new declaration: it goes on from its
    checkpoints."""
    STALE = "stale"
    """This instance runs a declaration the consumer has left behind (the one back or
    older): it must apply nothing of it."""


class Severity(enum.StrEnum):
    """How much a health verdict needs an operator (``projections health`` exits with its
    :attr:`exit_code`)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    """Not moving, but nothing says it cannot recover on its own."""
    CRITICAL = "critical"
    """Nothing will move it without an operator or a new instance."""

    @property
    def exit_code(self) -> int:
        return list(Severity).index(self)


class Verdict(enum.StrEnum):
    """The health of a partition (and of a consumer: its partitions' worst), from the
    database alone; members are listed from the least to the most alarming."""

    CAUGHT_UP = "caught-up"
    """Nothing of it left to apply."""
    PAUSED = "paused"
    """An operator paused the consumer."""
    REBUILDING = "rebuilding"
    """The consumer is being rebuilt (or a rebuild was asked for)."""
    LAGGING = "lagging"
    """Messages left to apply, and a checkpoint committed within the stall timeout."""
    PARKED = "parked"
    """Sources of it are parked (``on-failure: park-source``): their messages wait for an
    operator's retry, skip or evict, while the rest goes on."""
    UNDECLARED = "undeclared"
    """Instances are live and none of them declares it: the running code no longer has it
    (``projections remove`` removes it)."""
    OUTDATED = "outdated"
    """A live instance has run a declaration of it that the database replaced for longer
    than the stall timeout: it applies nothing of it until it runs the current code."""
    STALLED = "stalled"
    """Messages left to apply and no checkpoint committed for the stall timeout."""
    HALTED = "halted"
    """A poison message stopped it."""
    UNOWNED = "unowned"
    """No live instance has owned it for stale-instance-timeout plus one second."""

    @property
    def severity(self) -> Severity:
        if self in (Verdict.PARKED, Verdict.UNDECLARED, Verdict.OUTDATED, Verdict.STALLED):
            return Severity.DEGRADED
        if self in (Verdict.HALTED, Verdict.UNOWNED):
            return Severity.CRITICAL
        return Severity.HEALTHY
