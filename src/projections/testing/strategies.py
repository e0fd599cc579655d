"""Hypothesis strategies: cluster events, and appends built from the application's own
message classes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from projections.testing.events import (
    Append,
    ClusterEvent,
    Crash,
    DeliverDue,
    Join,
    LoseAck,
    Pause,
    PauseAndWake,
    Poll,
    Pulse,
    Stop,
    Tick,
    Wake,
)

SOURCES: SearchStrategy[str] = st.sampled_from([f"source-{n}" for n in range(8)])
"""Source ids when none are given: few, so that sources repeat and partitions fill up."""


def picks() -> SearchStrategy[int]:
    """Which of the eligible instances an event applies to (an index, taken modulo)."""
    return st.integers(0, 3)


def ticks() -> SearchStrategy[int]:
    """How many rebalance intervals one tick event lets pass."""
    return st.integers(1, 3)


def pauses() -> SearchStrategy[int]:
    """How many rebalance intervals a pause-and-wake event freezes an instance for."""
    return st.integers(1, 8)


def messages_of(
    *types: type,
    topic: str,
    source: str | SearchStrategy[str] = SOURCES,
    fields: Mapping[str, SearchStrategy[Any]] | None = None,
    max_messages: int = 3,
) -> SearchStrategy[Append]:
    """Appends of 1 to ``max_messages`` messages of one source, each an instance of one of
    the attrs classes ``types``, to ``topic``.

    ``fields`` gives a strategy for each field name it lists (in whichever of ``types`` has
    such a field); other fields are built from their annotated types. ``source`` is a
    strategy of source ids (which are also the partition keys), or the name of a field
    that every one of ``types`` has and that holds the source id: the source is then
    drawn from ``fields`` (or :data:`SOURCES`) and set in each message of the append.
    """
    if not types:
        raise TypeError("messages_of() needs at least one message class")
    given = dict(fields or {})
    key: str | None = None
    sources: SearchStrategy[str]
    if isinstance(source, str):
        key, sources = source, given.get(source, SOURCES)
    else:
        sources = source
    for cls in types:
        if not attrs.has(cls):
            raise TypeError(f"messages_of() takes attrs classes, not {cls!r}")
        if key is not None and key not in attrs.fields_dict(cls):
            raise TypeError(f"messages_of(source={key!r}): {cls.__qualname__} has no such field")
    one = st.one_of(
        [
            st.builds(cls, **{k: v for k, v in given.items() if k in attrs.fields_dict(cls)})
            for cls in types
        ]
    )

    @st.composite
    def appends(draw: st.DrawFn) -> Append:
        source_id = draw(sources)
        messages = draw(st.lists(one, min_size=1, max_size=max_messages))
        if key is not None:
            messages = [attrs.evolve(m, **{key: source_id}) for m in messages]
        return Append(topic, source_id, messages)

    return appends()


def cluster_events(messages: SearchStrategy[Append]) -> SearchStrategy[ClusterEvent]:
    """Any event: join, stop, crash, pause, wake, lose-ack, pause-and-wake, pulse, a delivery
    of due deadlines before a read, tick, poll, or an append from ``messages`` (see
    :func:`messages_of`)."""
    return st.one_of(
        st.just(Join()),
        st.builds(Stop, picks()),
        st.builds(Crash, picks()),
        st.builds(Pause, picks()),
        st.builds(Wake, picks()),
        st.builds(LoseAck, picks(), st.booleans()),
        st.builds(PauseAndWake, picks(), pauses()),
        st.builds(Pulse, picks(), st.booleans()),
        st.builds(DeliverDue, picks()),
        st.builds(Tick, ticks()),
        st.just(Poll()),
        messages,
    )
