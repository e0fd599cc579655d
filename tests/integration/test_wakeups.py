"""Same-host wake-ups name the topics a commit appended to; a pulse beats only for its own."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from messaging import Database, MessageStore, Settings, create_plugin_manager
from messaging._lifecycle import Identity
from messaging.runtime._pulser import Pulser
from messaging.store._wakeup import _QUEUE_LENGTH, ANY_TOPIC, Listener, WakeUps
from projections.examples.ledger import AccountOpened


@pytest.fixture
def listening() -> Any:
    wakeups = WakeUps(f"test-{uuid.uuid4().hex}")
    listener = wakeups.listen()
    assert listener is not None
    yield wakeups, listener
    listener.close()


def test_a_wake_up_names_its_topics_or_any(listening: tuple[WakeUps, Listener]) -> None:
    """The topics sent are the topics received (pending ones merged); none named, too
    many to send, or a stop's poke stand for any topic; no wake-up, no topics."""
    wakeups, listener = listening
    assert listener.wait(0) == frozenset()
    wakeups.notify({"orders", "payments"})
    wakeups.notify({"orders", "refunds"})
    assert listener.wait(5) == {"orders", "payments", "refunds"}
    wakeups.notify()
    assert listener.wait(5) == {ANY_TOPIC}
    wakeups.notify({f"{i:04d}-{'x' * 195}" for i in range(30)})  # about 6 KB of names
    assert listener.wait(5) == {ANY_TOPIC}
    listener.poke()
    assert listener.wait(5) == {ANY_TOPIC}
    wakeups.notify({"line\nbreak"})  # a valid topic name, but not one to split on
    assert listener.wait(5) == {ANY_TOPIC}


def test_a_full_queue_counts_as_a_wake_up_about_any_topic(
    listening: tuple[WakeUps, Listener],
) -> None:
    """Once the listener's queue is full a wake-up may have been refused, whatever its
    topics: the listener takes the full queue for any topic."""
    wakeups, listener = listening
    for _ in range(_QUEUE_LENGTH + 5):  # the sends past the queue's length are refused
        wakeups.notify({"payments"})
    assert listener.wait(5) == {"payments", ANY_TOPIC}
    wakeups.notify({"payments"})
    assert listener.wait(5) == {"payments"}


def test_a_commit_wakes_the_readers_of_the_topics_it_appended_to(tmp_path: Path) -> None:
    """Database.transaction sends the topics of the appends it committed; a rolled-back
    one sends nothing."""
    db = Database(f"sqlite:///{tmp_path / 'app.db'}")
    db.prepare()
    listener = db.wakeups.listen()
    assert listener is not None
    try:
        store = MessageStore(db)
        with db.transaction() as conn:
            store.append(conn, "ledger", "a-1", [AccountOpened("a-1", "ann")])
            store.append(conn, "audit", "a-1", [AccountOpened("a-1", "ann")])
        assert listener.wait(5) == {"ledger", "audit"}
        with pytest.raises(RuntimeError), db.transaction() as conn:
            store.append(conn, "ledger", "a-2", [AccountOpened("a-2", "bob")])
            raise RuntimeError("roll back")
        with db.transaction() as conn:
            store.append(conn, "audit", "a-3", [AccountOpened("a-3", "cy")])
        assert listener.wait(5) == {"audit"}  # the rolled-back append sent nothing
    finally:
        listener.close()
        db.dispose()


def test_a_pulse_beats_for_wake_ups_about_its_topics_only() -> None:
    """An instance reading ``ledger`` beats when woken about it or about any topic, not
    when woken about topics none of its consumers read."""
    worker = SimpleNamespace(spec=SimpleNamespace(topics=("ledger",)))
    parts = SimpleNamespace()  # what _concerns does not touch
    pulser = Pulser(
        db=parts,  # type: ignore[arg-type]
        who=Identity("i", "i", create_plugin_manager([], load_entrypoints=False).hook),
        settings=Settings().messaging.consumer,
        membership=parts,  # type: ignore[arg-type]
        rebalancer=parts,  # type: ignore[arg-type]
        units=SimpleNamespace(workers={"c": worker}),  # type: ignore[arg-type]
        in_memory={},
        watchdog=parts,  # type: ignore[arg-type]
        outage=parts,  # type: ignore[arg-type]
    )
    assert pulser._concerns(frozenset({"ledger", "audit"}))
    assert pulser._concerns(frozenset({ANY_TOPIC}))
    assert not pulser._concerns(frozenset({"audit"}))
    assert not pulser._concerns(frozenset())
