"""Lifecycle events are one structured line each, with their fields on the record too."""

from __future__ import annotations

import logging

import pytest

from messaging._lifecycle import lifecycle_event


def test_an_event_is_one_key_value_line_with_the_fields_on_the_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Values with spaces or quotes are quoted; None fields are left out."""
    with caplog.at_level(logging.INFO, logger="messaging.runtime.lifecycle"):
        lifecycle_event(
            "halt",
            consumer="ledger",
            partition=3,
            instance="host:1",
            epoch=None,
            error='ValueError: "bad" input',
        )
    (record,) = caplog.records
    assert record.getMessage() == (
        'event=halt consumer=ledger partition=3 instance=host:1 error="ValueError: \\"bad\\" input"'
    )
    assert record.lifecycle == {  # type: ignore[attr-defined]
        "event": "halt",
        "consumer": "ledger",
        "partition": 3,
        "instance": "host:1",
        "error": 'ValueError: "bad" input',
    }
