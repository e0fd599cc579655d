"""The pytest plugin (entry point ``pytest11``): the database option and the fixtures.

The database of simulated clusters is, in this order: ``--projections-database URL``,
``$PROJECTIONS_TEST_DATABASE``, the ``projections_database`` ini option; when none is
set, each cluster gets a temporary SQLite file. A configured server that cannot be
reached fails the tests that use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from typing import Protocol

import hypothesis
import pytest

from messaging import Settings
from projections.testing.cluster import SimulatedCluster, open_cluster
from projections.testing.database import DATABASE_ENV, configure_database, configured_database
from projections.testing.machine import ClusterMachine
from projections.testing.runner import REPORT_SECONDS, run_cluster_machine

_OPTION = "projections_database"


class MakeCluster(Protocol):
    """The ``make_cluster`` fixture's type."""

    def __call__(
        self,
        consumers: Sequence[type],
        *,
        instances: int = 3,
        settings: Settings | None = None,
        plugins: Iterable[object] = (),
    ) -> SimulatedCluster: ...


class RunMachine(Protocol):
    """The ``run_machine`` fixture's type."""

    def __call__(
        self,
        machine: type[ClusterMachine],
        settings: hypothesis.settings | None = None,
        *,
        report_seconds: float = REPORT_SECONDS,
    ) -> None: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("projections", "projections testing kit")
    group.addoption(
        "--projections-database",
        dest=_OPTION,
        metavar="URL",
        help=f"database of simulated clusters (default: ${DATABASE_ENV}, else a "
        "temporary SQLite file per cluster); their tables are dropped afterwards",
    )
    parser.addini(_OPTION, f"database of simulated clusters (after ${DATABASE_ENV})")


_PREVIOUS = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_PREVIOUS] = configure_database(
        config.getoption(_OPTION) or os.environ.get(DATABASE_ENV) or config.getini(_OPTION) or None
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    configure_database(config.stash.get(_PREVIOUS, None))


@pytest.fixture
def projections_database_url() -> str | None:
    """The database of simulated clusters (None: a temporary SQLite file each). Override
    it to run the kit's fixtures elsewhere, e.g. parametrized over backends."""
    return configured_database()


@pytest.fixture
def make_cluster(projections_database_url: str | None) -> Iterator[MakeCluster]:
    """``make_cluster(consumers, instances=3, settings=None, plugins=())``: a
    :class:`SimulatedCluster` with ``instances`` joined (``i0``, ``i1``...), on a scratch
    database dropped after the test."""
    with ExitStack() as stack:

        def make(
            consumers: Sequence[type],
            *,
            instances: int = 3,
            settings: Settings | None = None,
            plugins: Iterable[object] = (),
        ) -> SimulatedCluster:
            cluster = stack.enter_context(
                open_cluster(
                    consumers,
                    settings=settings,
                    database_url=projections_database_url,
                    plugins=plugins,
                )
            )
            for _ in range(instances):
                cluster.join()
            return cluster

        yield make


@pytest.fixture
def run_machine(projections_database_url: str | None) -> RunMachine:
    """``run_machine(Machine, settings=None, *, report_seconds=30)``: run a
    :class:`ClusterMachine` subclass's battery, then the machine as a Hypothesis test, on
    this fixture's database (default settings: :func:`machine_settings`); a failure found
    by the search is reported within ``report_seconds`` of its start, shrinking included."""

    def run(
        machine: type[ClusterMachine],
        settings: hypothesis.settings | None = None,
        *,
        report_seconds: float = REPORT_SECONDS,
    ) -> None:
        run_cluster_machine(
            machine, settings, projections_database_url, report_seconds=report_seconds
        )

    return run
