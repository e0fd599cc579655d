"""The testing kit's pieces, on SQLite and on MySQL: the cluster fixture, cluster events,
message strategies, scratch databases and the pytest plugin's database option."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from effort import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select
from sqlalchemy.engine import make_url

from messaging import ConfigError, message
from projections.examples import ledger
from projections.testing import (
    Append,
    Crash,
    SimulatedCluster,
    Tick,
    cluster_events,
    messages_of,
    open_cluster,
    run_events,
    scratch_database,
)
from projections.testing.plugin import MakeCluster

ACCOUNTS = [f"acct-{n}" for n in range(3)]
OPENED = [Append(ledger.TOPIC, a, [ledger.AccountOpened(a, "bob")]) for a in ACCOUNTS]
DEPOSITS = messages_of(
    ledger.Deposited,
    topic=ledger.TOPIC,
    source="account_id",
    fields={"account_id": st.sampled_from(ACCOUNTS), "amount": st.integers(1, 9)},
)


def _balances(cluster: SimulatedCluster) -> dict[str, tuple[str, int, int]]:
    with cluster.db.read() as conn:
        return ledger.read_model(conn.execute(select(ledger.balances)).mappings())


def _replayed(cluster: SimulatedCluster) -> dict[str, tuple[str, int, int]]:
    return ledger.replay(message for _, message in cluster.appended)


def test_make_cluster_gives_running_instances_that_own_every_partition(
    make_cluster: MakeCluster,
) -> None:
    """The fixture's instances have joined and split the partitions between them."""
    cluster = make_cluster([ledger.Balances], instances=3)
    cluster.settle()
    owners = cluster.owners()
    assert sorted(cluster.running) == ["i0", "i1", "i2"]
    assert len(owners) == 8 and set(owners.values()) == {"i0", "i1", "i2"}


def test_a_crash_is_handed_over_within_the_bound(make_cluster: MakeCluster) -> None:
    """The manual clock makes handover timing exact: the crashed instance's partitions
    are owned again once it is stale, within the bound, and applied once."""
    cluster = make_cluster([ledger.Balances], instances=2)
    run_events(cluster, [*OPENED, Crash(0), Tick(int(cluster.handover_bound))])
    assert set(cluster.owners().values()) == {"i1"}
    cluster.settle()
    assert _balances(cluster) == _replayed(cluster)


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(events=st.lists(cluster_events(DEPOSITS), max_size=15))
def test_any_event_list_then_settling_gives_the_replayed_balances(
    projections_database_url: str | None, events: list[object]
) -> None:
    """Event lists from the strategies apply to any cluster state; after settling, the
    balances equal a sequential replay."""
    with open_cluster([ledger.Balances], database_url=projections_database_url) as cluster:
        run_events(cluster, [*OPENED, *events])  # type: ignore[list-item]
        if not cluster.running:
            cluster.join()
        cluster.settle()
        assert _balances(cluster) == _replayed(cluster)


def test_the_scenario_replays_to_the_same_cluster(projections_database_url: str | None) -> None:
    """The recorded scenario is Python: run against a fresh cluster it gives the same
    owners, commits and read model."""
    consumers = [ledger.Balances]
    with open_cluster(consumers, database_url=projections_database_url) as first:
        first.join()
        run_events(first, OPENED)
        first.poll_all()
        first.pause("i0")
        first.join()
        first.tick(4.0)
        first.wake("i0")
        first.settle()
        scenario = first.scenario()
        recorded = (first.owners(), first.commits, _balances(first))
    assert "cluster.wake('i0')  # t=+4.0s, applied" in scenario
    assert "#     i1 claimed ledger-balances" in scenario
    with open_cluster(consumers, database_url=projections_database_url) as cluster:
        exec(scenario, {**vars(ledger), "cluster": cluster})
        assert (cluster.owners(), cluster.commits, _balances(cluster)) == recorded


@message("test.kit.note")
@attrs.define(frozen=True)
class Noted:
    account_id: str
    text: str


@settings(max_examples=examples(30), deadline=None)
@given(
    batch=messages_of(
        ledger.Deposited, Noted, topic="t", source="account_id", fields={"text": st.just("x")}
    ),
    free=messages_of(Noted, topic="u", source=st.just("s-1"), max_messages=1),
)
def test_messages_of_builds_appends_of_one_source(batch: Append, free: Append) -> None:
    """Every message of an append carries its source in the named field; per-field
    strategies apply to the classes having the field; a source strategy is used as is."""
    assert 1 <= len(batch.messages) <= 3 and batch.topic == "t"
    messages: Sequence[Any] = batch.messages  # Deposited and Noted: both have account_id
    assert all(m.account_id == batch.source for m in messages)
    assert all(m.text == "x" for m in batch.messages if isinstance(m, Noted))
    assert free.source == "s-1" and len(free.messages) == 1


def test_messages_of_refuses_what_it_cannot_build() -> None:
    """Plain classes and a source field missing from a class are errors naming them."""
    with pytest.raises(TypeError, match="attrs classes"):
        messages_of(dict, topic="t")
    with pytest.raises(TypeError, match="Withdrawn has no such field"):
        messages_of(ledger.Withdrawn, topic="t", source="owner")


def test_a_scratch_database_leaves_nothing_behind(projections_database_url: str | None) -> None:
    """On a configured server every table the cluster made is dropped; a temporary SQLite
    file is deleted."""
    with scratch_database(projections_database_url, [ledger.balances]) as db:
        db.dispose()
        url, prefix = db.url, db.schema.prefix
    if projections_database_url is None:
        assert not Path(str(make_url(url).database)).exists()
        return
    with scratch_database(projections_database_url) as other, other.engine.connect() as conn:
        names = inspect(conn).get_table_names()
    assert [n for n in names if n.startswith(prefix) or n == ledger.balances.name] == []


def test_an_unreachable_configured_database_fails_naming_the_setting() -> None:
    """A configured server that cannot be reached is an error, never a skip."""
    unreachable = scratch_database("mysql+pymysql://nobody@127.0.0.1:9/none")
    with pytest.raises(ConfigError, match="PROJECTIONS_TEST_DATABASE"), unreachable:
        pass


@pytest.mark.parametrize("where", ["option", "env", "ini"])
def test_the_database_option_reaches_the_fixtures(
    where: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--projections-database``, ``$PROJECTIONS_TEST_DATABASE`` and the
    ``projections_database`` ini option each set the fixtures' database."""
    url = "mysql://user@db.example/test"
    monkeypatch.delenv("PROJECTIONS_TEST_DATABASE", raising=False)
    pytester.makepyfile(
        f"""
        def test_url(projections_database_url):
            assert projections_database_url == {url!r}
        """
    )
    args = ["-p", "projections.testing.plugin", "-p", "no:cacheprovider"]
    if where == "option":
        args.append(f"--projections-database={url}")
    elif where == "env":
        monkeypatch.setenv("PROJECTIONS_TEST_DATABASE", url)
    else:
        pytester.makeini(f"[pytest]\nprojections_database = {url}\n")
    pytester.runpytest(*args).assert_outcomes(passed=1)
