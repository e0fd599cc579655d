"""A version being built that halts never holds its live version stopped.

The live version halted on a message and an operator skipped it; a rebuild replays it,
and the new version halts there within a batch of the live one. Before, the cutover
began anyway (or had begun) and the live version stayed stopped (readable, never
updated) until an operator resumed the new version. Now no cutover starts while the
version is halted, and one that started goes back: the live version applies again, and
the cutover is taken once the version is resumed. Both backends, on the testing kit's
simulated cluster (real instances and database, the clock moved by the test)."""

from __future__ import annotations

import logging

import pytest
from poison_item import Item
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select

from messaging import HandlerContext, handler
from messaging._states import ConsumerState
from messaging.store._rows import partition_of
from messaging.versions import _cutover, _halted_build
from projections import _operations, projection
from projections._version_commands import format_versions, versions_report
from projections.testing.cluster import SimulatedCluster
from projections.testing.plugin import MakeCluster

NAME = "halting-items"
FAILS_ON: set[str] = set()

items = Table(
    "halting_items",
    MetaData(),
    Column("name", String(50), primary_key=True),
    Column("position", Integer, nullable=False),
)


@projection(NAME, topics="items", partitions=2, tables=[items])
class HaltingItems:
    @handler
    def item(self, event: Item, ctx: HandlerContext) -> None:
        if event.name in FAILS_ON:
            raise ValueError(f"cannot handle {event.name}")
        ctx.execute(insert(items), {"name": event.name, "position": ctx.envelope.position})


def _state(cluster: object) -> str:
    db = cluster.db  # type: ignore[attr-defined]
    c = db.schema.consumers
    with db.read() as conn:
        return str(conn.execute(select(c.c.state).where(c.c.name == NAME)).scalar_one())


def _names(cluster: object) -> set[str]:
    db = cluster.db  # type: ignore[attr-defined]
    table = db.read_model(items)
    with db.read() as conn:
        return set(conn.execute(select(table.c.name)).scalars())


@pytest.fixture(autouse=True)
def _fails_on_poison() -> object:
    FAILS_ON.clear()
    FAILS_ON.add("poison")
    yield
    FAILS_ON.clear()


def _rebuilt_past_a_skip_whose_halt_goes_unseen(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> SimulatedCluster:
    """One instance; the live version halted on ``poison`` and an operator skipped it; a
    rebuild is requested, whose first cutover round misses the halt of version 2."""
    cluster = make_cluster([HaltingItems], instances=1)
    cluster.append("items", "s1", [Item("a1"), Item("poison"), Item("a2")])
    cluster.settle()
    _operations.resume(cluster.db, NAME, who="op", skip_poison=True)
    cluster.settle()
    seen = [False]
    halted_partition = _halted_build.halted_partition

    def unseen_once(*args: object) -> object:  # the first round misses the halt
        if not seen[0]:
            seen[0] = True
            return None
        return halted_partition(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_cutover, "halted_partition", unseen_once)
    cluster.rebuild()
    return cluster


def test_a_halted_build_leaves_the_live_version_applying_until_it_is_resumed(
    make_cluster: MakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster([HaltingItems], instances=2)
    cluster.append("items", "s1", [Item("a1"), Item("poison"), Item("a2")])
    cluster.settle()  # the live version halts at the poison message
    skipped = _operations.resume(cluster.db, NAME, who="op", skip_poison=True)
    assert [s["type"] for s in skipped] == ["test.poison.item"]
    cluster.settle()
    assert _names(cluster) == {"a1", "a2"}

    cluster.rebuild()  # version 2 replays the skipped message, and halts on it
    with caplog.at_level(logging.WARNING, logger="messaging"):
        cluster.settle()
    assert _state(cluster) == ConsumerState.RUNNING  # the live version was never stopped
    report = versions_report(cluster.db, cluster.settings.messaging.consumer, NAME)
    [build] = [v["build"] for v in report["versions"] if "build" in v]
    assert build["halted"] == [partition_of("s1", 2)]
    assert f"halted (partitions {build['halted'][0]}): projections resume {NAME}@2" in (
        format_versions(report)
    )
    cluster.append("items", "s2", [Item("b1")])
    cluster.settle()
    assert _names(cluster) == {"a1", "a2", "b1"}  # and goes on applying

    FAILS_ON.clear()  # the handler is fixed: the version is resumed and takes over
    _operations.resume(cluster.db, f"{NAME}@2", who="op")
    cluster.settle()
    cluster.settle()
    assert _names(cluster) == {"a1", "poison", "a2", "b1"}
    assert _state(cluster) == ConsumerState.RUNNING


def test_a_cutover_begun_before_its_version_halted_goes_back(
    make_cluster: MakeCluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version halts after the live version stopped for it (a halt the round before
    had not seen): the next round lets the live version apply again, and says so."""
    cluster = _rebuilt_past_a_skip_whose_halt_goes_unseen(make_cluster, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="messaging"):
        cluster.settle()
    assert "event=cutover-cancelled" in caplog.text
    assert f"resume {NAME}@2 to take it over" in caplog.text
    assert _state(cluster) == ConsumerState.RUNNING
    cluster.append("items", "s2", [Item("b1")])
    cluster.settle()
    assert _names(cluster) == {"a1", "a2", "b1"}


@pytest.mark.parametrize("committed", [True, False], ids=["ack-lost", "rolled-back"])
def test_a_cutover_undone_whose_outcome_is_lost_is_undone_once(
    make_cluster: MakeCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    committed: bool,
) -> None:
    """The transaction letting the live version apply again loses its outcome (committed,
    or rolled back with the connection); the round is retried as the loop does: the live
    version applies again, once, says so once, and the version takes over once resumed."""
    cluster = _rebuilt_past_a_skip_whose_halt_goes_unseen(make_cluster, monkeypatch)
    [name] = cluster.running
    for _ in range(5):  # version 2 starts, then the live version stops for the cutover
        cluster.tick()
        if _state(cluster) == ConsumerState.CUTTING_OVER:
            break
    assert _state(cluster) == ConsumerState.CUTTING_OVER
    cluster.poll_all()  # version 2 halts on the skipped message
    undone: list[bool] = []
    resume_live = _halted_build.resume_live

    def counted(*args: object) -> None:
        undone.append(True)
        resume_live(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_cutover, "resume_live", counted)
    with caplog.at_level(logging.WARNING, logger="messaging"):
        cluster.lose_in_round(name, 1, committed=committed)  # the undo's outcome is lost
    assert undone == ([True] if committed else [True, True])  # retried: done, or again
    assert caplog.text.count("event=cutover-cancelled") == 1
    assert _state(cluster) == ConsumerState.RUNNING
    cluster.append("items", "s2", [Item("b1")])
    cluster.settle()
    assert _names(cluster) == {"a1", "a2", "b1"}

    FAILS_ON.clear()
    _operations.resume(cluster.db, f"{NAME}@2", who="op")
    cluster.settle()
    cluster.settle()
    assert _names(cluster) == {"a1", "poison", "a2", "b1"}
    assert _state(cluster) == ConsumerState.RUNNING
    report = versions_report(cluster.db, cluster.settings.messaging.consumer, NAME)
    assert [v["version"] for v in report["versions"] if v.get("state") == "running"] == [2]
