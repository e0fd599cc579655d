"""A projection whose name needs percent-encoding in a URL (a space, a slash, ``?``, ``#``,
``%`` and a non-ASCII letter), for tests that operate it over HTTP."""

from __future__ import annotations

import attrs

from messaging import HandlerContext, handler, message
from projections import projection

CONSUMER = "stock levels/ü?#%"
TOPIC = "odd-names"


@message("test.odd-names.noted")
@attrs.define(frozen=True)
class Noted:
    n: int


@projection(CONSUMER, topics=TOPIC, partitions=2)
class OddlyNamed:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        """Nothing to write: the test operates the consumer, not its read model."""
