"""What the saga store reads and writes: saga instances' rows and their deadlines."""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

import attrs


class SagaRow(NamedTuple):
    """One saga instance as read at the start of a batch (``version`` None: not stored).
    Named tuples, as :class:`Deadline`: a batch reads hundreds, each made in one call."""

    key: str
    version: int | None
    state: str | None
    ended: bool
    state_version: int = 1
    """The version of the stored state's shape (see ``@saga(state_version=)``)."""


class Deadline(NamedTuple):
    """A deadline of one saga instance: ``message`` is delivered to it at ``due_at``."""

    key: str
    name: str
    partition: int
    due_at: float
    type: str
    payload: str
    payload_version: int = 1
    """The version of the payload's shape (its class's when it was scheduled)."""


deadline_id = attrgetter("key", "name", "due_at")
"""A deadline's ``(key, name, due_at)``: which one it is, as its delivery names it."""


@attrs.define(frozen=True, kw_only=True)
class Due:
    """Due deadlines as :meth:`SagaStore.due` reads them."""

    deadlines: list[Deadline]
    """Earliest first."""
    now: float
    """The database's time when they were read (0.0 if none was due)."""
    sagas: dict[str, SagaRow]
    """The stored row of each one's saga instance (version None where there is none)."""
