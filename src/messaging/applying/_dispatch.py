"""Decoding stored rows and calling a consumer's handlers, the first failure as poison."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from messaging._consumers import ConsumerSpec
from messaging._errors import DecodeError
from messaging._messages import MessageRegistry
from messaging.applying._context import HandlerContext
from messaging.failures._poison import Poison
from messaging.store._database import Database
from messaging.store._refusals import refusal
from messaging.store._retry import is_transient
from messaging.store._rows import (
    PAYLOAD,
    PAYLOAD_VERSION,
    POSITION,
    TYPE,
    StoredRow,
    partition_in,
)

Decoders = Sequence[Callable[[Any, int | None], Any]]
"""The decode functions of one stored type name, indexed by payload version."""
Handler = tuple[Decoders, Callable[[Any, HandlerContext], Any]]
"""(decoders by payload version, handle) of one stored type name."""


def versioned_decoders(registry: MessageRegistry, name: str) -> dict[str, Decoders]:
    """For the message class registered as ``name``: per stored type name that reaches it
    (its own, and the old names renames and upcasters lead from), the decode functions by
    payload version: the generated decoder at the current version, the upcasters' way at
    older ones, a function raising the reason at versions no chain leads from. A version
    past the end is newer than this code knows (:func:`unreadable`)."""
    found: dict[str, Decoders] = {}
    for stored, by_version in registry.readers_of(name).items():
        found[stored] = [
            by_version.get(version) or registry.reader(stored, version)
            for version in range(max(by_version) + 1)
        ]
    return found


def unreadable(registry: MessageRegistry, row: StoredRow, error: Exception) -> Exception:
    """What failed applying ``row``, which raised ``error``: for an IndexError (maybe its
    payload version past the end of its decoders), the reason its version cannot be read,
    if it cannot."""
    if not isinstance(error, IndexError):
        return error
    try:
        registry.reader(row[TYPE], row[PAYLOAD_VERSION])(row[PAYLOAD], row[POSITION])
    except DecodeError as exc:
        return exc
    return error


def _without_context(method: Callable[[Any], Any]) -> Callable[[Any, HandlerContext], Any]:
    def call(message: Any, _ctx: HandlerContext) -> Any:
        return method(message)

    return call


class Dispatcher:
    """Decodes rows and calls the consumer's handler for each."""

    def __init__(self, spec: ConsumerSpec, registry: MessageRegistry, db: Database) -> None:
        self.spec = spec
        self.registry = registry
        self.db = db
        self.target = spec.cls()
        self.handlers: dict[str, Handler] = {}
        self.current: dict[str, str] = {}
        """The current type name of each stored type name read."""
        for cls, attribute in spec.handlers.items():
            method = getattr(self.target, attribute)
            if spec.handler_arity[cls] == 1:
                method = _without_context(method)
            name = registry.type_name(cls)
            for stored, decoders in versioned_decoders(registry, name).items():
                self.handlers[stored] = (decoders, method)
                self.current[stored] = name
        self.type_names = sorted(self.handlers)
        """The stored type names read: those of the handled classes and the older names
        that reach them."""

    def parking_keys(self, rows: Sequence[StoredRow]) -> Sequence[StoredRow]:
        """``rows`` (read with their source) with the source of each replaced by the key it
        parks under (``on-failure: park-source``): its source here; None for a message
        that cannot park (its failure halts the partition), which is never held back."""
        return rows

    def apply(self, rows: Sequence[StoredRow], ctx: HandlerContext, partition_count: int) -> None:
        """Decode and handle ``rows`` in order; raise the first failure as :class:`Poison`
        (a transient database error, or one refusing writes, as itself: the batch is
        retried)."""
        handlers, deadline = self.handlers, ctx.deadline
        at, clock = deadline.at, deadline.clock
        row: StoredRow | None = None
        try:
            for row in rows:  # (with their partition hash or not: indexed, not unpacked)
                position = ctx.position = row[0]
                decoders, call = handlers[row[1]]
                call(decoders[row[3]](row[2], position), ctx)  # by payload version
                if clock() > at or deadline.expired:  # deadline.passed(), inlined
                    raise deadline.error(position)
        except Exception as exc:
            if row is None:
                raise
            if deadline.passed():  # whatever failed past it (an interrupted statement)
                error: Exception = deadline.error(row[0])
            elif is_transient(exc) or refusal(exc):
                raise
            else:
                error = unreadable(self.registry, row, exc)
            raise Poison(row, partition_in(row, partition_count), error) from exc
