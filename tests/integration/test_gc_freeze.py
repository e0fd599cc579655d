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


@pytest.mark.parametrize("freeze", ["true", "false"])
def test_the_first_start_freezes_the_heap_once_unless_turned_off(
    tmp_path: Path, freeze: str
) -> None:
    """In a fresh process: with ``gc-freeze`` (the default) the first start moves the
    objects held to the permanent generation and a second start adds none; turned off,
    nothing is frozen."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, freeze],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, first, second = map(int, done.stdout.split())
    assert before == 0
    if freeze == "true":
        # the imported modules and more, once (the first stop frees some of them)
        assert first > 10_000 and second <= first
    else:
        assert first == second == 0
