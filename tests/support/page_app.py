"""An application for the cluster page and metrics tests: two projections on one topic,
``page-healthy`` applies its messages, ``page-halted`` fails on every one (its partitions
halt). ``page_stalled_app`` declares a third, run by another instance (frozen: stalled)."""

from __future__ import annotations

import attrs

from messaging import HandlerContext, MessageStore, handler, message
from messaging.store._database import Database
from projections import projection

TOPIC = "page"
HEALTHY, STALLED, HALTED = "page-healthy", "page-stalled", "page-halted"


@message("test.page.noted")
@attrs.define(frozen=True)
class Noted:
    n: int


@projection(HEALTHY, topics=TOPIC, partitions=4)
class Healthy:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        return None


@projection(HALTED, topics=TOPIC, partitions=2)
class Halted:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        raise ValueError(f"message {event.n} is poison")


def append(db: Database, first: int, count: int) -> None:
    """Append ``count`` messages numbered from ``first``, each of its own source."""
    store = MessageStore(db)
    with db.transaction() as conn:
        for n in range(first, first + count):
            store.append(conn, TOPIC, f"s{n}", [Noted(n)])
