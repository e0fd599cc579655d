"""An instance's start and stop, in process."""

from __future__ import annotations

import uuid

import pytest

from messaging import (
    Database,
    Instance,
    ProjectionsError,
    SchemaError,
    Settings,
    collect_consumers,
    create_plugin_manager,
)


def _instance(db: Database, name: str) -> Instance:
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    return Instance(db, collect_consumers(manager), Settings(), manager.hook, name=name)


def test_a_second_live_instance_with_the_same_name_is_refused(db: Database) -> None:
    """Two live instances never share a name; the error says which name and where."""
    first = _instance(db, "twin")
    first.start()
    try:
        second = _instance(db, "twin")
        with pytest.raises(ProjectionsError, match="instance name 'twin' is taken"):
            second.start()
        second.stop()
    finally:
        first.stop()
    with db.read() as conn:
        assert conn.execute(db.schema.instances.select()).all() == []


@pytest.mark.mysql
def test_a_failed_start_reports_its_own_error(mysql_database_url: str) -> None:
    """On a schema that was never migrated, run() raises the SchemaError, not a later one."""
    db = Database(mysql_database_url, table_prefix=f"u{uuid.uuid4().hex[:8]}_")
    try:
        with pytest.raises(SchemaError, match="V1__initial_schema"):
            _instance(db, "unmigrated").run()
    finally:
        db.dispose()


def test_a_name_held_by_a_dead_process_on_this_host_is_taken_over(db: Database) -> None:
    """A restarted worker reuses its name at once when its predecessor's pid is gone."""
    import socket
    import subprocess
    import sys

    from messaging.distribution._membership import InstanceInfo, Membership

    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    with db.transaction() as conn:
        Membership(db).register(
            conn,
            InstanceInfo(id="ghost", name="worker-1", host=socket.gethostname(), pid=dead_pid.pid),
        )
    instance = _instance(db, "worker-1")
    instance.start(loops=False)
    try:
        with db.read() as conn:
            names = {(r.id, r.name) for r in Membership(db).instances(conn, 30)}
        assert names == {(instance.id, "worker-1")}
    finally:
        instance.stop()


def test_claims_and_releases_are_logged_as_lifecycle_events(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Each claimed and released partition is one line with consumer, partition, instance, epoch."""
    import logging

    with caplog.at_level(logging.INFO, logger="messaging.runtime.lifecycle"):
        instance = _instance(db, "logged")
        instance.start(loops=False)
        instance.stop()
    events = [r.lifecycle for r in caplog.records if hasattr(r, "lifecycle")]
    claims = [e for e in events if e["event"] == "claim" and e["consumer"] == "ledger-balances"]
    releases = [e for e in events if e["event"] == "release" and e["consumer"] == "ledger-balances"]
    assert sorted(e["partition"] for e in claims) == list(range(8))
    assert all(e["instance"] == "logged" and e["epoch"] >= 1 for e in claims)
    # Every line names the instance by its name, and carries its id as a field of its own.
    assert all((e["instance"], e["instance_id"]) == ("logged", instance.id) for e in events)
    assert (
        "event=claim consumer=ledger-balances partition=0 instance=logged "
        f"instance_id={instance.id} epoch="
    ) in caplog.text
    assert sorted(e["partition"] for e in releases) == list(range(8))
