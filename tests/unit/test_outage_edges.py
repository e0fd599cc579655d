"""An outage's edges: one WARNING when the database goes, one INFO when it is back."""

from __future__ import annotations

import logging

import pymysql
import pytest
from sqlalchemy.exc import OperationalError

from messaging.runtime._outage import Outage

REFUSED = OperationalError("SELECT 1", {}, pymysql.err.OperationalError(2003, "refused"))


def test_a_success_as_the_server_goes_down_does_not_split_the_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection opened before may answer once as the server goes down: within
    ``settle`` of the first failure that success does not end the outage, so the failures
    after it start no second one; a success after that ends it, logged once."""
    outage = Outage("instance x")
    with caplog.at_level(logging.INFO, logger="messaging.runtime.outage"):
        assert outage.failed(REFUSED)
        outage.succeeded()  # too early to tell
        still_down = outage.down
        assert outage.failed(REFUSED)
        outage.settle = 0.0  # as if the settling second had passed
        outage.succeeded()
        outage.succeeded()
    assert (still_down, outage.down) == (True, False)
    messages = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert messages == [
        ("WARNING", "instance x: database unreachable"),
        ("INFO", messages[1][1]),
    ]
    assert "reachable again after" in messages[1][1]
