"""Declaration changes on running ``projections run`` processes (three declarations of
one projection, v1 → v2 → v3): a new declaration builds a new version of the read model
that takes over from the live one, instances on
the replaced one stop applying it and warn until restarted, late instances on the
declaration one back or an older one apply nothing and say which, and a requested
rebuild lets the earlier version take over again (a roll back)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tally_app
from clusters import cli, owned_by, wait_until
from sqlalchemy import MetaData
from tally_cluster import TallyCluster

from messaging import Database

pytestmark = pytest.mark.multiprocess

REPLACED = "rebuilt under another declaration; applying nothing until restarted"
ONE_BACK = (
    "this instance runs the previous declaration; applying nothing until restarted with the "
    "live one, or until `projections rollback tally` (or `rebuild`) makes this one live"
)
OLDER = "this instance runs a declaration older than the previous one"
LONG_IDLE_WAITS = {
    "stale-instance-timeout": "10s",
    "graceful-shutdown-timeout": "5s",
}
"""An idle apply loop waits up to stale-instance-timeout for news: one that nobody wakes
would hold a stop until graceful-shutdown-timeout."""


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [tally_app.metadata]


@pytest.fixture
def cluster(db: Database, tmp_path: Path) -> Iterator[TallyCluster]:
    with TallyCluster(db, tmp_path) as running:
        yield running


def test_declaration_changes_on_a_running_cluster(db: Database, cluster: TallyCluster) -> None:
    """v1 applies; v2 rebuilds and v1 goes quiet; v3 rebuilds and v2 goes quiet; late v2
    and v1 instances apply nothing; v2 restarted as v3 shares the projection again; after
    a requested rebuild, a v2 instance rolls the projection back to v2."""
    cluster.start("a1", 1)
    cluster.append(40)
    cluster.wait_applied_by(1, "a1 to apply everything under v1")

    cluster.start("b2", 2)
    cluster.wait_applied_by(2, "b2 to rebuild the read model under v2")
    cluster.wait_logged("a1", REPLACED)
    assert "event=declaration-mismatch consumer=tally instance=a1" in cluster.log("a1")
    cluster.append(40)
    cluster.wait_applied_by(2, "b2 alone to apply new messages")

    cluster.start("c3", 3)
    cluster.wait_applied_by(3, "c3 to rebuild the read model under v3")
    cluster.wait_logged("b2", REPLACED)

    cluster.start("d2", 2)  # one declaration back
    cluster.start("e1", 1)  # older than that
    cluster.wait_logged("d2", ONE_BACK)
    cluster.wait_logged("e1", OLDER)
    for name in ("d2", "e1"):
        assert "event=rebuild" not in cluster.log(name), f"{name} rebuilt back"
    cluster.append(40)
    cluster.wait_applied_by(3, "c3 alone to apply new messages")
    wait_until(  # (claimed again right after the cutover): no stale instance owns one
        lambda: owned_by(db, {"c3"}, tally_app.CONSUMER),
        timeout=10,
        what="c3 to own every partition",
    )

    cluster.stop("b2")
    cluster.start("b3", 3)  # restarted with the current declaration: it shares again
    wait_until(
        lambda: (
            set((owned_by(db, {"c3", "b3"}, tally_app.CONSUMER) or {}).values()) == {"c3", "b3"}
        ),
        timeout=60,
        what="c3 and b3 to share the projection",
    )
    cluster.append(40)
    cluster.wait_applied_by(3, "c3 and b3 to apply new messages under v3")

    # Roll back: stop the v3 instances, ask for a rebuild, start the earlier version.
    cluster.stop("c3")
    cluster.stop("b3")
    cli(cluster.config, "rebuild", tally_app.CONSUMER, "--reason", "roll back")
    cluster.start("r2", 2)
    cluster.wait_applied_by(2, "r2 to rebuild the read model under v2 again")
    cluster.append(40)
    cluster.wait_applied_by(2, "r2 to apply new messages under v2")
    assert cluster.log("a1").count(REPLACED) == 1, "the warning is given once, not each round"


def test_instances_on_the_replaced_declaration_retire_it_without_an_error(
    cluster: TallyCluster,
) -> None:
    """A rolling deploy of v2 over two v1 instances: each v1 instance says once that it
    stopped applying the projection, and logs no error."""
    cluster.start("a1", 1)
    cluster.start("b1", 1)
    cluster.append(40)
    cluster.wait_applied_by(1, "a1 and b1 to apply everything under v1")

    cluster.start("c2", 2)
    cluster.wait_applied_by(2, "c2 to rebuild the read model under v2")
    for name in ("a1", "b1"):
        cluster.wait_logged(name, REPLACED)
    cluster.append(40)
    cluster.wait_applied_by(2, "c2 alone to apply new messages")
    for name in ("a1", "b1"):
        log = cluster.log(name)
        assert log.count(REPLACED) == 1, f"{name} did not say it once"
        assert " ERROR " not in log and "Traceback" not in log, f"{name} logged an error"


def test_an_instance_on_the_replaced_declaration_stops_as_fast_as_any(
    db: Database, tmp_path: Path
) -> None:
    """After a rolling deploy of v2, a v1 instance stops about as fast as the v2 instance
    does, well within graceful-shutdown-timeout: its retired apply loop has ended."""
    with TallyCluster(db, tmp_path, consumer=LONG_IDLE_WAITS) as cluster:
        cluster.start("a1", 1)
        cluster.append(40)
        cluster.wait_applied_by(1, "a1 to apply everything under v1")
        cluster.start("b2", 2)
        cluster.wait_applied_by(2, "b2 to rebuild the read model under v2")
        cluster.wait_logged("a1", REPLACED)

        retired = cluster.stop("a1")
        normal = cluster.stop("b2")
    assert retired < min(normal + 1.0, 2.5), f"a1 took {retired:.1f} s, b2 {normal:.1f} s"
    assert "still busy" not in cluster.log("a1")
