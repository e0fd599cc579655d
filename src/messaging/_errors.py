"""The project's exception tree: every error we raise derives from :class:`ProjectionsError`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class ProjectionsError(Exception):
    """Root of every error this framework raises on purpose."""


class ConfigError(ProjectionsError, ValueError):
    """A setting is missing, malformed or breaks a validation rule; the message names the key."""


class RegistrationError(ProjectionsError, TypeError):
    """A message type, consumer or plugin cannot be registered as declared."""


class DecodeError(ProjectionsError, ValueError):
    """A stored message cannot be turned into its typed message."""

    def __init__(self, reason: str, *, position: int | None, type_name: str) -> None:
        where = f"message at position {position}" if position is not None else "message"
        super().__init__(f"cannot decode {where} of type {type_name!r}: {reason}")
        self.reason = reason
        self.position = position
        self.type_name = type_name


class VersionConflict(ProjectionsError):
    """An append expected a source version the store does not have (optimistic concurrency)."""

    def __init__(self, *, topic: str, source: str, expected: int, actual: int | None) -> None:
        found = f"found {actual}" if actual is not None else "a concurrent append got there first"
        super().__init__(
            f"version conflict on {topic}/{source}: expected version {expected}, {found}"
        )
        self.topic = topic
        self.source = source
        self.expected = expected
        self.actual = actual


class SchemaError(ProjectionsError):
    """The database schema is missing, behind or ahead of what this code expects."""


class OwnershipLost(ProjectionsError):
    """A fenced checkpoint update matched no row: another instance owns the partition now."""

    def __init__(self, consumer: str, partitions: list[int]) -> None:
        super().__init__(f"ownership of {consumer} partitions {partitions} was lost; rolled back")
        self.consumer = consumer
        self.partitions = partitions


class CheckpointMoved(ProjectionsError):
    """A fenced checkpoint update found its partitions still owned under the same epochs but
    a checkpoint already past the one the batch was read from: an earlier commit of the same
    batch went through unacknowledged. Roll back and continue from ``checkpoints``."""

    def __init__(self, consumer: str, checkpoints: dict[int, int]) -> None:
        super().__init__(
            f"{consumer} partitions {sorted(checkpoints)} were already checkpointed "
            f"(at {checkpoints}): an earlier commit went through; rolled back"
        )
        self.consumer = consumer
        self.checkpoints = checkpoints


class ConcurrentUpdate(ProjectionsError):
    """A versioned row (a long-running process's state) changed under a batch; the batch is
    retried whole."""


class OperationError(ProjectionsError, ValueError):
    """An operator command cannot be carried out as asked (unknown consumer, wrong state)."""


class Unanswered(ProjectionsError):
    """A one-shot command gave its transaction up: the database did not answer (or a lock
    stayed taken) for the command's whole time budget. ``outcome_unknown``: an attempt lost
    its connection, so it may have committed. ``reads_only``: it wrote nothing asked for,
    and says that the database did not answer."""

    def __init__(
        self,
        what: str,
        database: str,
        waited: float,
        attempts: int,
        error: BaseException,
        *,
        outcome_unknown: bool,
        reads_only: bool = False,
    ) -> None:
        reason = (str(getattr(error, "orig", None) or error).splitlines() or [""])[0]
        if reads_only:
            message = (
                f"database {database} did not answer {what} within {waited:.1f}s "
                f"({attempts} attempt(s): {reason})"
            )
        else:
            message = (
                f"{what} gave up after {waited:.1f}s and {attempts} attempt(s) waiting for "
                f"database {database}: {reason}" + (" (it may have committed)" * outcome_unknown)
            )
        super().__init__(message)
        self.what = what
        self.database = database
        self.waited = waited
        self.attempts = attempts
        self.error = error
        self.outcome_unknown = outcome_unknown


class WaitRefused(ProjectionsError):
    """A wait for a consistency token that cannot end in "applied" without an operator or
    another write: a partition it waits on is halted, the consumer is paused, or a
    position of the token holds none of its messages (the append rolled back)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownConsumer(WaitRefused, ValueError):
    """A wait named a consumer the database does not know."""


def unknown_consumer(name: str, known: Iterable[str]) -> str:
    """``unknown consumer 'x'`` and the closest of the ``known`` names (``did you mean``),
    or the list of them when none is close."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown consumer {name!r}; did you mean {close[0]!r}?"
    return f"unknown consumer {name!r}; known consumers: {', '.join(known) or 'none'}"


class WaitTimeout(ProjectionsError, TimeoutError):
    """A wait for a consistency token ran out of time; ``behind`` lists what is still
    behind (:class:`~messaging.waits._progress.Behind`: consumer, partition, checkpoint,
    lag, owner, state)."""

    def __init__(self, waited: float, behind: Sequence[object]) -> None:
        shown = "; ".join(map(str, behind[:5])) + (
            f"; and {len(behind) - 5} more" if len(behind) > 5 else ""
        )
        super().__init__(f"not applied after {waited:.3g}s: {shown}")
        self.waited = waited
        self.behind = list(behind)


class UnknownPayloadVersion(DecodeError):
    """A stored (type, version) newer than every declaration this code has (written by a
    newer instance during a rolling deploy): never decoded by guesswork."""

    def __init__(self, type_name: str, version: int, *, position: int | None = None) -> None:
        super().__init__(
            f"needs a newer declaration of type {type_name!r} version {version}",
            position=position,
            type_name=type_name,
        )
        self.version = version


class ApplyTimedOut(ProjectionsError, TimeoutError):
    """A batch outlasted its consumer's ``apply-timeout``: it was rolled back (its statement
    interrupted if one was running) and the message being handled fails like a poison one."""

    def __init__(self, timeout: str, position: int) -> None:
        super().__init__(f"apply timeout ({timeout}) exceeded at position {position}")
        self.timeout = timeout
        self.position = position
