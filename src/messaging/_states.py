"""Every state word the framework stores, reports or returns, as string enums.

Each member *is* its string (``enum.StrEnum``): stored columns, JSON reports and log
lines hold exactly the words below, and rows read back compare equal to the members.
"""

from __future__ import annotations

import enum

__all__ = ["ConsumerState", "CopyState", "DeclarationOutcome", "OwnerState", "PartitionStatus"]


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
    new version of it (:mod:`messaging.runtime._versions`)."""
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
