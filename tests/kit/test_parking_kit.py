"""The kit's ParkingSteps on SQLite and MariaDB: a machine whose projection parks poisoned
sources keeps, through handovers, lost acknowledgements, fixes and retries, every message
applied once and each source in its order; and on a framework that does not record a park
(its held messages lost at the next claim), the same steps fail."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import ClassVar

import attrs
import pytest
from hypothesis import strategies as st
from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, func, insert, select

from messaging import HandlerContext, handler, message
from messaging.runtime._parking import Parking
from projections import projection
from projections.testing import (
    Append,
    ClusterMachine,
    ParkingSteps,
    machine_settings,
    messages_of,
    simulation_settings,
)
from projections.testing.plugin import RunMachine

metadata = MetaData()
ranks = Table(
    "test_parking_kit",
    metadata,
    Column("source", String(16), primary_key=True),
    Column("rank", Integer, primary_key=True, autoincrement=False),
    Column("n", Integer, nullable=False),
)


@message("test-parking-kit.noted")
@attrs.define(frozen=True)
class Noted:
    key: str
    n: int


@projection("parking-kit", topics="notes", partitions=2, tables=[ranks])
class Notes:
    """Each source's numbers in the order they were applied (its rank among its source's)."""

    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        before = ctx.connection.execute(
            select(func.count()).select_from(ranks).where(ranks.c.source == event.key)
        ).scalar_one()
        ctx.execute(insert(ranks), {"source": event.key, "rank": before + 1, "n": event.n})


class NotesMachine(ParkingSteps, ClusterMachine):
    consumers: ClassVar[Sequence[type]] = (Notes,)
    messages = messages_of(
        Noted,
        topic="notes",
        source="key",
        fields={"key": st.sampled_from(["a", "b", "c"]), "n": st.integers(0, 99)},
    )
    poison_topics = ("notes",)
    cluster_settings = simulation_settings(projections={"on-failure": "park-source"})
    battery = ()

    def expected(self, messages: Sequence[object]) -> object:
        found: dict[str, list[int]] = {}
        for m in messages:
            assert isinstance(m, Noted)
            found.setdefault(m.key, []).append(m.n)
        return found

    def actual(self, conn: Connection) -> object:
        found: dict[str, list[int]] = {}
        for row in conn.execute(select(ranks).order_by(ranks.c.source, ranks.c.rank)):
            found.setdefault(row.source, []).append(row.n)
        return found


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logger = logging.getLogger("messaging")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_poisoned_sources_park_and_apply_once_in_order_after_retry(
    run_machine: RunMachine, backend: str
) -> None:
    examples = 20 if backend == "sqlite" else 8
    run_machine(NotesMachine, machine_settings(max_examples=examples, steps=30))


def test_a_park_never_recorded_is_caught(
    monkeypatch: pytest.MonkeyPatch, projections_database_url: str | None
) -> None:
    """Broken: parks are not written; the next claim forgets them, and the poisoned
    message (fixed meanwhile) is never applied."""
    monkeypatch.setattr(Parking, "write", lambda self, conn, parks: None)
    machine = NotesMachine(projections_database_url)
    try:
        machine.append(Append("notes", "a", [Noted("a", 1)]))
        machine.append_poisoned(Append("notes", "a", [Noted("a", 2), Noted("a", 3)]))
        machine.poll()
        machine.crash(0)
        machine.crash(0)
        machine.join()
        with pytest.raises(AssertionError, match="differs"):
            machine.settle()
    finally:
        machine.teardown()
