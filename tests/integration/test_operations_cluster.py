"""Operator commands on running ``projections run`` processes: a pause from the CLI stops
both instances of a cluster, and a resume has both take the projection up again."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import tally_app
from clusters import cli, owned_by, owners, wait_until
from sqlalchemy import MetaData, select
from tally_cluster import TallyCluster

from messaging import Database
from messaging.distribution._membership import Membership
from projections._operations import default_operator

pytestmark = pytest.mark.multiprocess

CONSUMER = tally_app.CONSUMER


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [tally_app.metadata]


@pytest.fixture
def cluster(db: Database, tmp_path: Path) -> Iterator[TallyCluster]:
    with TallyCluster(db, tmp_path) as running:
        yield running


def _shared(db: Database) -> bool:
    return set((owned_by(db, {"p1", "p2"}, CONSUMER) or {}).values()) == {"p1", "p2"}


def _heartbeats_since(db: Database, since: float) -> bool:
    """Whether both instances heartbeated at ``since`` (database time) or later."""
    with db.read() as conn:
        beats = {i.name: i.heartbeat_at for i in Membership(db).instances(conn, 30)}
    return all(beats.get(name, 0.0) >= since for name in ("p1", "p2"))


def test_pause_and_resume_reach_every_running_instance(db: Database, cluster: TallyCluster) -> None:
    """While paused, neither instance applies what is appended, over three rebalance
    rounds; after resume both share the projection again and apply it all, once."""
    cluster.start("p1", 1)
    cluster.start("p2", 1)
    cluster.append(40)
    cluster.wait_applied_by(1, "p1 and p2 to apply the first messages")
    wait_until(lambda: _shared(db), timeout=60, what="p1 and p2 to share the projection")

    cli(cluster.config, "pause", CONSUMER, "--reason", "maintenance")
    with db.read() as conn:
        paused_at = conn.execute(select(db.clock.now())).scalar_one()
    cluster.append(40)
    wait_until(
        lambda: _heartbeats_since(db, paused_at + 1.0),
        timeout=60,
        what="both instances to run for a second (three rebalance rounds) after the pause",
    )
    assert cluster.versions() == Counter({1: 40}), "applied while paused"
    assert {state for _, state in owners(db, CONSUMER).values()} == {"UNCLAIMED"}
    status = json.loads(cli(cluster.config, "status", "--json"))
    assert [c["state"] for c in status["consumers"]] == ["paused"]

    cli(cluster.config, "resume", CONSUMER)
    cluster.wait_applied_by(1, "the messages appended while paused to be applied")
    wait_until(lambda: _shared(db), timeout=60, what="p1 and p2 to share the projection again")
    audit = json.loads(cli(cluster.config, "audit", CONSUMER, "--json"))["audit"]
    operator = default_operator()  # the CLI records who runs it, never a name it is given
    assert [(e["command"], e["who"]) for e in audit] == [("pause", operator), ("resume", operator)]
