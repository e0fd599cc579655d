"""A failing look at the pulse is no change (the regular round comes anyway), but not a
silent one: logged once at WARNING without a traceback, once at INFO when it works again;
an unreachable database is the instance's outage, logged by it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from messaging import Database, Instance, Settings, create_plugin_manager


def _instance(db: Database) -> Instance:
    return Instance(db, [], Settings(), create_plugin_manager([], load_entrypoints=False).hook)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_failing_pulse_is_logged_once_without_traceback_then_its_recovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unprepared file has no tables to read the pulse from: one WARNING naming the
    error for two failed looks; once the schema exists, one INFO."""
    db = Database(f"sqlite:///{tmp_path}/pulse.db")
    try:
        instance = _instance(db)
        pulser = instance.pulser
        with caplog.at_level(logging.INFO):
            assert not pulser.look()
            assert not pulser.look()
            (warning,) = _warnings(caplog)
            expected = "reading the pulse failed (OperationalError: no such table"
            assert expected in warning.getMessage()
            assert warning.exc_info is None
            db.prepare()
            caplog.clear()
            pulser.look()
            pulser.look()
        assert [r.getMessage() for r in caplog.records] == [
            f"instance {instance.name}: reading the pulse works again"
        ]
    finally:
        db.dispose()


def test_an_unreachable_database_while_looking_is_the_instance_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database file that cannot be opened is logged once, as the outage it is."""
    db = Database(f"sqlite:///{tmp_path}/missing/pulse.db")
    try:
        instance = _instance(db)
        with caplog.at_level(logging.INFO):
            assert not instance.pulser.look()
            assert not instance.pulser.look()
        (warning,) = _warnings(caplog)
        assert "database unreachable" in warning.getMessage()
        assert instance.outage.down
    finally:
        db.dispose()
