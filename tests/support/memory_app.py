"""An application with one in-memory projection that counts items and cannot handle an
item named ``poison``, for real-process tests of operating in-memory copies."""

from __future__ import annotations

import attrs

from messaging import handler, message
from projections import in_memory_projection

TOPIC = "memory-items"
CONSUMER = "test-memory"


@message("test.memory.item")
@attrs.define(frozen=True)
class Item:
    name: str


@in_memory_projection(CONSUMER, topics=TOPIC)
class Counter:
    def __init__(self) -> None:
        self.count = 0

    @handler
    def item(self, event: Item) -> None:
        if event.name == "poison":
            raise ValueError("cannot count poison")
        self.count += 1
