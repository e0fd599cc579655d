"""A database URL naming several nodes: parsing, and the errors of a bad one."""

from __future__ import annotations

import pytest

from messaging import Database
from messaging._errors import ConfigError
from messaging.store._nodes import join_hosts, split_hosts
from messaging.store._retry import is_ambiguous, is_transient


def test_several_hosts_split_into_the_first_and_the_list() -> None:
    url = "mysql+pymysql://app:pw@db1:3306,db2,10.0.0.3:3307/app?charset=utf8mb4"
    first, nodes = split_hosts(url)
    assert first == "mysql+pymysql://app:pw@db1:3306/app?charset=utf8mb4"
    assert nodes == [("db1", 3306), ("db2", None), ("10.0.0.3", 3307)]
    assert join_hosts(first, nodes) == url


def test_one_host_is_left_alone() -> None:
    assert split_hosts("mysql://app@db1:3306/app") == ("mysql://app@db1:3306/app", [])
    assert split_hosts("sqlite:///a,b.db") == ("sqlite:///a,b.db", [])  # a comma in a path


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mysql://app@db1:3306,db2:x/app", "'db2:x' is not host or host:port"),
        ("mysql://app@db1:3306,,db2/app", "'' is not host or host:port"),
        ("mysql://app@db1:3306,db2:70000/app", "'db2:70000' is not host or host:port"),
        ("sqlite://h1,h2/a.db", "only MySQL/MariaDB takes several hosts"),
    ],
)
def test_a_bad_host_list_fails_in_one_line_naming_it(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as error:
        Database(url)
    message = str(error.value)
    assert "\n" not in message
    assert (reason in message and "invalid database URL" in message) or "unsupported" in message


def test_a_multi_host_database_keeps_its_hosts_and_driver() -> None:
    db = Database("mysql://root:secret@127.0.0.1:4406,127.0.0.1:4407/test")
    try:
        assert db.url == "mysql+pymysql://root:secret@127.0.0.1:4406,127.0.0.1:4407/test"
        assert "secret" not in repr(db) and "127.0.0.1:4407" in repr(db)
    finally:
        db.dispose()


@pytest.mark.parametrize("code", [1047, 1180])
def test_a_node_out_of_the_primary_component_is_transient_and_ambiguous(code: int) -> None:
    import pymysql
    from sqlalchemy.exc import OperationalError

    error = OperationalError("COMMIT", {}, pymysql.err.OperationalError(code, "wsrep"))
    assert is_transient(error) and is_ambiguous(error)
