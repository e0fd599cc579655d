"""Tests of MySQL-only behaviour: the ``db`` fixture runs on MySQL/MariaDB alone here."""

from __future__ import annotations

import pytest


@pytest.fixture
def backend() -> str:
    return "mysql"
