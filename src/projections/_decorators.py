"""``@projection`` and ``@in_memory_projection``: mark a class as a projection consumer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from sqlalchemy import Table

from messaging import ConsumerOptions, mark_consumer
from messaging.kinds import DEFAULT_PARTITIONS
from projections._kinds import IN_MEMORY_PROJECTION, PROJECTION

C = TypeVar("C", bound=type)


def _topics(topics: str | Iterable[str]) -> tuple[str, ...]:
    return (topics,) if isinstance(topics, str) else tuple(topics)


def projection(
    name: str,
    *,
    topics: str | Iterable[str],
    partitions: int = DEFAULT_PARTITIONS,
    tables: Iterable[Table] = (),
    version: int = 1,
) -> Callable[[C], C]:
    """Declare a projection: its read-model ``tables`` are written in the same transaction
    as its checkpoint, so every message has its effect exactly once, across handovers too.

    Handlers are methods marked with :func:`messaging.handler`; the type of their
    message parameter selects the messages. Raise ``version`` to force a rebuild.
    """
    options = ConsumerOptions(
        name=name,
        kind=PROJECTION,
        topics=_topics(topics),
        partitions=partitions,
        tables=tuple(tables),
        version=version,
    )

    def decorate(cls: C) -> C:
        mark_consumer(cls, options)
        return cls

    return decorate


def in_memory_projection(name: str, *, topics: str | Iterable[str]) -> Callable[[C], C]:
    """Declare an in-memory projection: every instance runs it whole, from the start of its
    topics, keeping its state in the consumer object."""
    options = ConsumerOptions(
        name=name, kind=IN_MEMORY_PROJECTION, topics=_topics(topics), partitions=1
    )

    def decorate(cls: C) -> C:
        mark_consumer(cls, options)
        return cls

    return decorate
