"""Real processes, both backends: removing a consumer the running code no longer declares.

While an instance declares it, ``projections remove`` is refused naming the instance.
Once the code without it runs, ``health`` reports it ``undeclared`` (a warning naming the
remove command, not a critical ``unowned``) and ``pause`` is refused up front. ``remove``
deletes its rows (consumer, partitions, a route consumer's handled ids, a saga's states
and deadlines), audited; its tables are dropped with ``--drop-tables`` or kept, and a kept
table is refused to a new declaration until ``remove --drop-tables`` drops it. Declared
again after that, the projection is built from the first message: nothing applied twice.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import forked
import pytest
import removal_app as app
from admin_client import post, served_admin
from admin_schemas import COMMAND, check
from clusters import start_instance, stop_instance, wait_until, write_config
from sqlalchemy import MetaData, func, inspect, select

from messaging import Database, MessageStore, OperationError
from projections._removal import remove

pytestmark = pytest.mark.multiprocess

ITEMS = {"apple": 3, "pear": 2, "plum": 1}
"""Item → how many ``Received`` of quantity 1..n are appended."""
STAYS = "rm-tally"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [app.metadata]


def _append(db: Database) -> None:
    store = MessageStore(db)
    with db.transaction() as conn:
        for item, n in ITEMS.items():
            store.append(conn, app.ITEMS, item, [app.Received(item, q) for q in range(1, n + 1)])
        for trip in ("t1", "t2"):
            store.append(conn, app.TRIPS, trip, [app.TripStarted(trip)])
        for notice in ("n1", "n2", "n3"):
            store.send(conn, "rm-notify", app.Notice(notice), key=notice, message_id=notice)


def _count(db: Database, table: Any, **where: str) -> int:
    with db.read() as conn:
        if not inspect(conn).has_table(table.name):
            return 0
        query = select(func.count()).select_from(table)
        for column, value in where.items():
            query = query.where(table.c[column] == value)
        return int(conn.execute(query).scalar_one())


def _stock(db: Database) -> dict[str, int]:
    with db.read() as conn:
        if not inspect(conn).has_table(app.stock.name):
            return {}
        return {r.item: r.qty for r in conn.execute(select(app.stock))}


def _expected_stock() -> dict[str, int]:
    return {item: n * (n + 1) // 2 for item, n in ITEMS.items()}


def _run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([*args, "--config", str(config)])


def _ok(config: Path, *args: str) -> str:
    done = _run(config, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _health(config: Path) -> dict[str, Any]:
    report = json.loads(_run(config, "health", "--json").stdout)
    return {c["name"]: c for c in report["consumers"]} | {"": report}


def _tables(db: Database) -> set[str]:
    with db.read() as conn:
        return set(inspect(conn).get_table_names())


def test_a_consumer_is_removed_once_no_running_code_declares_it(
    db: Database, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", db)
    _append(db)
    everything = start_instance(config, "all", "removal_app", log=tmp_path / "all.log")
    saga_rows = (db.schema.sagas, db.schema.deadlines)
    wait_until(
        lambda: (
            _stock(db) == _expected_stock()
            and _count(db, app.notified) == 3
            and all(_count(db, t, saga="rm-trips") == 2 for t in saga_rows)
        ),
        timeout=30,
        what="every consumer applied what was appended",
    )
    refused = _run(config, "remove", "rm-stock", "--reason", "too early")
    assert refused.returncode != 0
    assert "declared by the code of live instance(s) all (pid" in refused.stderr

    assert stop_instance(everything) == 0
    rest = start_instance(
        config, "rest", "removal_app", env={"REMOVAL_DECLARES": STAYS}, log=tmp_path / "rest.log"
    )
    health = wait_until(
        lambda: (h := _health(config))["rm-stock"]["verdict"] == "undeclared" and h,
        timeout=30,
        what="health to see the consumers the running code dropped",
    )
    for name in ("rm-stock", "rm-notify", "rm-trips"):
        assert health[name]["severity"] == "degraded", health[name]
        reason = health[name]["partitions"][0]["reason"]
        assert f"`projections remove {name}`" in reason, reason
    assert health[STAYS]["verdict"] == "caught-up"
    assert health[""]["status"] == "degraded"
    paused = _run(config, "pause", "rm-stock")
    assert paused.returncode != 0
    assert "declared by none of the 1 live instance(s)" in paused.stderr

    kept = _ok(config, "remove", "rm-stock", "--reason", "moved to the warehouse service")
    assert "kept tables: rm_stock" in kept
    assert _stock(db) == _expected_stock()  # kept as it was
    notify = json.loads(_ok(config, "remove", "rm-notify", "--drop-tables", "--json"))
    assert notify["rows"]["processed_messages"] == 3 and notify["dropped"] == ["rm_notified"]
    with served_admin(db, max_threads=2) as (url, _):  # the admin server's command
        status, trips = post(f"{url}/admin/consumers/rm-trips/remove", {"reason": "http"})
    assert status == 200, trips
    check(trips, COMMAND)
    assert trips["rows"]["sagas"] == 2 and trips["rows"]["deadlines"] == 2
    for table in saga_rows:
        assert _count(db, table, saga="rm-trips") == 0
    assert _count(db, db.schema.partitions, consumer="rm-stock") == 0
    assert "rm_notified" not in _tables(db) and "rm_stock" in _tables(db)
    health = _health(config)
    assert set(health) == {"", STAYS} and health[""]["status"] == "healthy"
    audit = json.loads(_ok(config, "audit", "--json"))["audit"]
    removals = {e["consumer"]: e for e in audit if e["command"] == "remove"}
    assert set(removals) == {"rm-stock", "rm-notify", "rm-trips"}
    assert removals["rm-trips"]["who"] == "admin token@127.0.0.1"
    assert removals["rm-stock"]["detail"]["reason"] == "moved to the warehouse service"

    again = start_instance(config, "again", "removal_app", log=tmp_path / "again.log")
    assert again.wait(timeout=30) != 0  # its declaration of rm_stock is refused
    assert "was kept when consumer 'rm-stock' was removed" in (tmp_path / "again.log").read_text()
    dropped = _ok(config, "remove", "rm-stock", "--drop-tables")
    assert "dropped tables: rm_stock" in dropped and "rm_stock" not in _tables(db)

    again = start_instance(config, "again", "removal_app", log=tmp_path / "again.log")
    wait_until(
        lambda: _stock(db) == _expected_stock() and _count(db, app.notified) == 3,
        timeout=30,
        what="the consumers declared again to be built from the first message",
    )
    assert stop_instance(again) == 0 and stop_instance(rest) == 0


def test_remove_refuses_what_it_cannot_remove(db: Database) -> None:
    with pytest.raises(OperationError, match="unknown consumer 'nothing'"):
        remove(db, "nothing", who="t")
    with pytest.raises(OperationError, match=r"'stock@2' is version 2 of 'stock': remove 'stock'"):
        remove(db, "stock@2", who="t")
    with pytest.raises(OperationError, match="the reason has 201 characters"):
        remove(db, "stock", who="t", reason="x" * 201)
