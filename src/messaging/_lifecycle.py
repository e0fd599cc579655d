"""Lifecycle events as structured log lines: one line per event, ``key=value`` pairs.

Claims, releases, lost partitions, halts, operator commands, rebuilds and declaration
mismatches are logged on the ``messaging.runtime.lifecycle`` logger as
``event=claim consumer=ledger partition=3 instance=host:42 instance_id=9c1e… epoch=7``
(``instance`` is always the instance's name, ``instance_id`` its id); the same fields are
on the record as ``record.lifecycle`` (a dict), for JSON log handlers.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import pluggy

log = logging.getLogger("messaging.runtime.lifecycle")


def _value(value: Any) -> str:
    """A bare value, or a JSON-quoted string when it has spaces, quotes or ``=``."""
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text)
    return text


def lifecycle_event(
    event: str,
    *,
    level: int = logging.INFO,
    exc_info: BaseException | None = None,
    **fields: Any,
) -> None:
    """Log one lifecycle event with its fields (None-valued fields are left out); with
    ``exc_info``, the line is followed by that exception's full traceback."""
    present = {key: value for key, value in fields.items() if value is not None}
    line = " ".join([f"event={event}", *(f"{k}={_value(v)}" for k, v in present.items())])
    log.log(level, line, exc_info=exc_info, extra={"lifecycle": {"event": event, **present}})


@attrs.frozen
class Identity:
    """Who acts, as events name it: an instance's unique id, its name (as log lines show
    it), and the plugins it tells (their hooks)."""

    id: str
    name: str
    hooks: pluggy.HookRelay = attrs.field(eq=False, repr=False)


def partition_event(who: Identity, consumer: str, partition: int, epoch: int | None) -> None:
    """A claim by ``who`` (with its epoch) or a release (``epoch`` None): log it, and tell
    the plugins."""
    lifecycle_event(
        "claim" if epoch is not None else "release",
        consumer=consumer,
        partition=partition,
        instance=who.name,
        instance_id=who.id,
        epoch=epoch,
    )
    if epoch is not None:
        who.hooks.projections_partition_claimed(
            consumer=consumer, partition=partition, epoch=epoch, instance_id=who.id
        )
    else:
        who.hooks.projections_partition_released(
            consumer=consumer, partition=partition, instance_id=who.id
        )
