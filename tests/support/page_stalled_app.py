"""The third projection of the cluster page tests, ``page-stalled``, in a module of its own:
the instance running it is frozen by the test, so its messages wait (``stalled``)."""

from __future__ import annotations

from page_app import STALLED, TOPIC, Noted

from messaging import HandlerContext, handler
from projections import projection


@projection(STALLED, topics=TOPIC, partitions=2)
class Stalled:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        return None
