"""A rebuilt consumer reports REBUILDING with its progress (messages replayed of those up
to the head as of the rebuild) until it reaches that head, then RUNNING: in the report,
``status``, ``status --json``, ``/admin/consumers`` and the admin page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_client import chromium, get_json, serve
from admin_schemas import CONSUMERS, check
from clusters import cli, seed_ledger, write_config

from messaging import Instance, collect_consumers, create_plugin_manager
from messaging._config import load_settings
from messaging.store._database import Database
from projections import _operations as operations
from projections._admin import make_server
from projections._reports import consumers_report

CONSUMER = "ledger-balances"


def _balances(db: Database) -> dict[str, Any]:
    report = consumers_report(db, load_settings(None).messaging.consumer)
    return next(c for c in report["consumers"] if c["name"] == CONSUMER)


@pytest.fixture
def rebuilder(db: Database, tmp_path: Path) -> Iterator[tuple[Path, Instance]]:
    """(config, instance): an instance driven by hand (no loops), batches of 20 messages
    (one lane, also on MySQL)."""
    config = write_config(
        tmp_path / "config.yaml",
        db,
        batch_size=20,
        extra=f"projections:\n  consumers:\n    {CONSUMER}: {{concurrency-limit: 1}}\n",
    )
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    settings = load_settings(str(config))
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="rebuilder")
    instance.start(loops=False)
    try:
        yield config, instance
    finally:
        instance.stop()


def test_a_rebuild_reports_its_progress_until_it_reaches_the_head_as_of_the_rebuild(
    db: Database, rebuilder: tuple[Path, Instance], tmp_path: Path
) -> None:
    """Each batch moves ``replayed`` on; messages appended after the rebuild are not part
    of it; the state returns to running once the rebuild's head is reached."""
    config, instance = rebuilder
    worker = instance.workers[CONSUMER]
    replayed = seed_ledger(db, 150)
    while worker.poll():
        pass
    assert _balances(db)["state"] == "running" and "rebuild" not in _balances(db)

    operations.rebuild(db, CONSUMER, who="test")
    instance.rebalance()  # performs the rebuild and claims every partition again
    seed_ledger(db, 40, seed=2, prefix="later")  # after the rebuild's head

    entry = _balances(db)
    assert entry["state"] == "rebuilding"
    assert entry["rebuild"] == {"target": replayed, "replayed": 0, "total": replayed}
    assert worker.poll() == 20
    entry = _balances(db)
    assert entry["rebuild"]["replayed"] == 20

    text = cli(config, "status")
    assert f"rebuilding: 20/{replayed} replayed up to position {replayed}" in text
    as_json = check(json.loads(cli(config, "status", "--json")), CONSUMERS)
    (listed,) = [c for c in as_json["consumers"] if c["name"] == CONSUMER]
    assert listed["state"] == "rebuilding" and listed["rebuild"] == entry["rebuild"]
    _check_admin(db, config, tmp_path, entry)

    seen = [entry["rebuild"]["replayed"]]
    while True:
        assert worker.poll() > 0
        entry = _balances(db)
        if entry["state"] != "rebuilding":
            break
        assert seen[-1] < entry["rebuild"]["replayed"] < replayed
        seen.append(entry["rebuild"]["replayed"])
    assert "rebuild" not in entry
    assert entry["state"] == "running"
    assert sum(p["lag"] for p in entry["partitions"]) > 0  # the later messages: lag, not rebuild
    assert "rebuilding" not in cli(config, "status")


def _check_admin(db: Database, config: Path, tmp_path: Path, entry: dict[str, Any]) -> None:
    """``/admin/consumers`` carries the progress, and the page shows it."""
    server = make_server(db, load_settings(str(config)), "127.0.0.1", 0)
    base, thread = serve(server)
    try:
        status, body = get_json(base + "/admin/consumers")
        assert status == 200
        check(body, CONSUMERS)
        (listed,) = [c for c in body["consumers"] if c["name"] == CONSUMER]
        assert listed["state"] == "rebuilding" and listed["rebuild"] == entry["rebuild"]
        dom = chromium(tmp_path / "profile", "--dump-dom", url=base + "/admin")
        assert dom.returncode == 0, dom.stderr
        total = entry["rebuild"]["total"]
        percent = f"{100 * 20 / total:.1f}"
        assert (
            f'<li data-consumer-state="{CONSUMER}" class="rebuilding">{CONSUMER}: rebuilding '
            f"20/{total} ({percent}%) replayed up to position {total}</li>"
        ) in dom.stdout
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
