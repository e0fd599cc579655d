"""The first instance a process starts freezes the process's objects (``gc-freeze``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc, sys
    from messaging import Database, Instance, collect_consumers, create_plugin_manager
    from messaging._config import settings_from_mapping

    settings = settings_from_mapping({"messaging": {"gc-freeze": sys.argv[2] == "true"}})
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    counts = [gc.get_freeze_count()]
    for name in ("first", "second"):
        db = Database(sys.argv[1])
        instance = Instance(db, collect_consumers(manager), settings, manager.hook, name=name)
        instance.start(loops=False)
        counts.append(gc.get_freeze_count())
        instance.stop()
        db.dispose()
    print(*counts)
    """
)


def _freeze_counts(script: str, tmp_path: Path, freeze: str) -> list[int]:
    """The freeze counts ``script`` prints, run in a fresh process on a SQLite file."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    done = subprocess.run(
        [sys.executable, "-c", script, url, freeze],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [int(count) for count in done.stdout.split()]


@pytest.mark.parametrize("freeze", ["true", "false"])
def test_the_first_start_freezes_the_heap_once_unless_turned_off(
    tmp_path: Path, freeze: str
) -> None:
    """In a fresh process: with ``gc-freeze`` (the default) the first start moves the
    objects held to the permanent generation and a second start adds none; turned off,
    nothing is frozen."""
    before, first, second = _freeze_counts(SCRIPT, tmp_path, freeze)
    assert before == 0
    if freeze == "true":
        # the imported modules and more, once (the first stop frees some of them)
        assert first > 10_000 and second <= first
    else:
        assert first == second == 0


APPLIED_SCRIPT = textwrap.dedent(
    """
    import gc, sys, threading
    from messaging import (
        Database, Instance, MessageStore, collect_consumers, create_plugin_manager, hookimpl,
    )
    from messaging._config import settings_from_mapping
    from projections.examples.ledger import TOPIC, AccountOpened

    applied = threading.Event()

    class Probe:
        @hookimpl
        def projections_batch_applied(self, consumer, count):
            if consumer == "ledger-balances":  # one worker, one lane (SQLite)
                applied.set()

    settings = settings_from_mapping(
        {
            "messaging": {
                "gc-freeze": sys.argv[2] == "true",
                "consumer": {"idle-poll-interval": "50ms", "rebalance-interval": "200ms"},
            }
        }
    )
    manager = create_plugin_manager(
        ["projections.examples.ledger"], plugins=[Probe()], load_entrypoints=False
    )
    db = Database(sys.argv[1])
    db.prepare()
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="only")
    instance.start()
    started = gc.get_freeze_count()
    # Two batches one after the other: the worker's loop freezes after the first one
    # returned, so before it applies the second.
    for account in ("a-1", "a-2"):
        applied.clear()
        with db.transaction() as conn:
            MessageStore(db).append(conn, TOPIC, account, [AccountOpened(account, "ann")])
        assert applied.wait(60), "no batch applied"
    after = gc.get_freeze_count()
    instance.stop()
    print(started, after)
    """
)


@pytest.mark.parametrize("freeze", ["true", "false"])
def test_the_first_applied_batch_freezes_the_heap_again(tmp_path: Path, freeze: str) -> None:
    """With ``gc-freeze``, a worker's first applied batch freezes what the process holds
    then (the statements built for it) too; turned off, never."""
    started, after = _freeze_counts(APPLIED_SCRIPT, tmp_path, freeze)
    if freeze == "true":
        assert after > started > 10_000
    else:
        assert started == after == 0
