"""The hooks only sagas call, added to every plugin manager through the saga kind."""

from __future__ import annotations

from collections.abc import Sequence

from messaging import hookspec


@hookspec
def projections_deadlines_delivered(
    consumer: str,
    instance_id: str,
    count: int,
    deadlines: Sequence[tuple[str, str, float]],
    lateness: Sequence[float],
) -> None:
    """``count`` saga deadlines of ``consumer`` were delivered and committed here:
    ``deadlines`` names each as (saga key, deadline name, due time), ``lateness`` holds,
    for each, the seconds between its due time and its delivery."""
