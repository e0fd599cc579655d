"""An application whose consumers are declared or not by the environment, for real-process
tests of removing a consumer: ``REMOVAL_DECLARES`` lists which of :data:`CONSUMERS` the
instance's code declares (all of them when unset).

- ``rm-stock``: a projection summing quantities per item into ``rm_stock``;
- ``rm-notify``: an idempotent route consumer recording each notice in ``rm_notified``;
- ``rm-trips``: a saga per trip, with a deadline a day ahead (a state and a deadline row);
- ``rm-tally``: a projection counting items into ``rm_tally``: the one that stays."""

from __future__ import annotations

import os
import time

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table

from messaging import HandlerContext, handler, message, route_consumer
from projections import projection
from sagas import SagaContext, saga, start

CONSUMERS = ("rm-stock", "rm-notify", "rm-trips", "rm-tally")
DECLARES = set(os.environ.get("REMOVAL_DECLARES", ",".join(CONSUMERS)).split(","))
ITEMS, TRIPS = "rm-items", "rm-trips"

metadata = MetaData()
stock = Table(
    "rm_stock",
    metadata,
    Column("item", String(50), primary_key=True),
    Column("qty", Integer, nullable=False),
)
notified = Table("rm_notified", metadata, Column("notice", String(50), primary_key=True))
tally = Table(
    "rm_tally",
    metadata,
    Column("item", String(50), primary_key=True),
    Column("n", Integer, nullable=False),
)


@message("test.rm.received")
@attrs.define(frozen=True)
class Received:
    item: str
    qty: int


@message("test.rm.notice")
@attrs.define(frozen=True)
class Notice:
    notice: str


@message("test.rm.trip")
@attrs.define(frozen=True)
class TripStarted:
    trip_id: str


@message("test.rm.late")
@attrs.define(frozen=True)
class Late:
    trip_id: str


@attrs.define
class Trip:
    started: float = 0.0


class Stock:
    @handler
    def received(self, event: Received, ctx: HandlerContext) -> None:
        ctx.upsert(stock, {"item": event.item}, add={"qty": event.qty})


class Notify:
    @handler
    def notice(self, notice: Notice, ctx: HandlerContext) -> None:
        ctx.upsert(notified, {"notice": notice.notice})


class Trips:
    @start
    def started(self, event: TripStarted, ctx: SagaContext) -> None:
        ctx.state = Trip(started=time.time())
        ctx.schedule(Late(event.trip_id), after=86400, name="late")

    @handler
    def late(self, event: Late, ctx: SagaContext) -> None:
        ctx.end()


class Tally:
    @handler
    def received(self, event: Received, ctx: HandlerContext) -> None:
        ctx.upsert(tally, {"item": event.item}, add={"n": 1})


if "rm-stock" in DECLARES:
    projection("rm-stock", topics=ITEMS, partitions=4, tables=[stock])(Stock)
if "rm-notify" in DECLARES:
    route_consumer("rm-notify", partitions=2, idempotent=True, tables=[notified])(Notify)
if "rm-trips" in DECLARES:
    saga("rm-trips", topics=TRIPS, correlate_by="trip_id", state=Trip, partitions=2)(Trips)
if "rm-tally" in DECLARES:
    projection("rm-tally", topics=ITEMS, partitions=2, tables=[tally])(Tally)
