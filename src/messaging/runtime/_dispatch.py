"""Decoding stored rows and calling a consumer's handlers, the first failure as poison."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from messaging._consumers import ConsumerSpec
from messaging._messages import MessageRegistry
from messaging.runtime._context import HandlerContext
from messaging.runtime._poison import Poison
from messaging.store._database import Database
from messaging.store._refusals import refusal
from messaging.store._retry import is_transient
from messaging.store._rows import StoredRow, partition_in

Handler = tuple[Callable[[Any, int | None], Any], Callable[[Any, HandlerContext], Any]]
"""(decode, handle) of one message type."""


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
        for cls, attribute in spec.handlers.items():
            name = registry.type_name(cls)
            method = getattr(self.target, attribute)
            if spec.handler_arity[cls] == 1:
                method = _without_context(method)
            self.handlers[name] = (registry.decoder(name), method)
        self.type_names = sorted(self.handlers)

    def apply(self, rows: Sequence[StoredRow], ctx: HandlerContext, partition_count: int) -> None:
        """Decode and handle ``rows`` in order; raise the first failure as :class:`Poison`
        (a transient database error, or one refusing writes, as itself: the batch is
        retried)."""
        handlers = self.handlers
        row: StoredRow | None = None
        try:
            for row in rows:  # (with their partition hash or not: indexed, not unpacked)
                position = ctx.position = row[0]
                decode, call = handlers[row[1]]
                call(decode(row[2], position), ctx)
        except Exception as exc:
            if is_transient(exc) or refusal(exc) or row is None:
                raise
            raise Poison(row, partition_in(row, partition_count), exc) from exc
