"""The targets of the attacks in this folder: a live instance's admin server with and
without a token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from admin_target import LiveAdmin, live_admin


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAdmin]:
    """A target whose admin server has a token."""
    with live_admin(tmp_path_factory.mktemp("guarded"), token=True) as live:
        yield live


@pytest.fixture(scope="module")
def unguarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAdmin]:
    """A target whose admin server has no token: commands are disabled."""
    with live_admin(tmp_path_factory.mktemp("unguarded"), token=False) as live:
        yield live
