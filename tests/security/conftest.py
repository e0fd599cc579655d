"""The targets of the attacks in this folder: a live instance's admin server with and
without a token, on SQLite and on MySQL/MariaDB."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from admin_target import LiveAdmin, live_admin, scratch_database

BACKENDS = ["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)]


def _target(request: pytest.FixtureRequest, *, token: bool) -> Iterator[LiveAdmin]:
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("target")
    with ExitStack() as stack:
        url = None
        if request.param == "mysql":
            session_database = request.getfixturevalue("mysql_database_url")
            name = f"prj_sec_{uuid.uuid4().hex[:10]}"
            url = stack.enter_context(scratch_database(session_database, name))
        yield stack.enter_context(live_admin(tmp, token=token, url=url))


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request: pytest.FixtureRequest) -> Iterator[LiveAdmin]:
    """A target whose admin server has a token."""
    yield from _target(request, token=True)


@pytest.fixture(scope="module", params=BACKENDS)
def unguarded(request: pytest.FixtureRequest) -> Iterator[LiveAdmin]:
    """A target whose admin server has no token: commands are disabled."""
    yield from _target(request, token=False)
