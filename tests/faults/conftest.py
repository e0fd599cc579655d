"""Lost COMMIT acknowledgements, on MariaDB only: SQLite has no connection whose
acknowledgement could be lost (its commit returns in-process), so the ``db`` fixture runs
on MySQL/MariaDB alone here, and the framework talks to it through an :class:`AckProxy`."""

from __future__ import annotations

from collections.abc import Iterator

import fault_app
import pytest
from ack_proxy import AckProxy
from sqlalchemy import MetaData
from sqlalchemy.engine import make_url

from messaging import Database


@pytest.fixture
def backend() -> str:
    return "mysql"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    """The fault application's tables: dropped before and after each test."""
    return [fault_app.metadata]


@pytest.fixture
def proxy(db: Database) -> Iterator[AckProxy]:
    """A proxy in front of the test server."""
    url = make_url(db.url)
    ack_proxy = AckProxy((url.host or "127.0.0.1", url.port or 3306))
    yield ack_proxy
    ack_proxy.close()


@pytest.fixture
def proxied(db: Database, proxy: AckProxy) -> Iterator[Database]:
    """The test's database, reached through the proxy (its own connection pool)."""
    database = Database(proxy.url(db.url), table_prefix=db.schema.prefix)
    with db.transaction() as conn:
        fault_app.metadata.create_all(conn)
    yield database
    database.dispose()
