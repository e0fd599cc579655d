"""A rolling deploy of a changed declaration under traffic, on real ``projections run``
processes: while the instances on the new declaration build its version, those on the
old one keep the live version current; the live version's lag stays at its level before
the deploy, and it is never left without progress (lag and no checkpoint moving) for
longer than the cutover's own stop, well under a second, at the default settings."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import tally_app
from clusters import wait_until
from sqlalchemy import MetaData, select
from tally_cluster import TallyCluster

from messaging import Database, MessageStore

pytestmark = pytest.mark.multiprocess

DEFAULTS = {
    "rebalance-interval": "10s",
    "stale-instance-timeout": "30s",
    "heartbeat-interval": "5s",
    "idle-poll-interval": "200ms",
    "graceful-shutdown-timeout": "20s",
    "conflict-retry": {"max-retries": 5, "max-delay": "1s"},
}
"""The default consumer settings (the test's config otherwise has sub-second ones): the
cutover must not wait for a rebalance round of 10 s."""


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [tally_app.metadata]


TRAFFIC_PER_SECOND = 60  # 3 messages every 50 ms


class Watch(threading.Thread):
    """Samples the live version of ``tally`` every 25 ms through an engine of its own:
    its number, its lag (messages past its partitions' checkpoints) and its checkpoints;
    also appends a few messages every 50 ms (the traffic), numbered from ``first``."""

    def __init__(self, db: Database, first: int) -> None:
        super().__init__(daemon=True)
        self.db = Database(db.url, table_prefix=db.schema.prefix)
        self.next = first
        self.samples: list[tuple[float, int, int, tuple[int, ...]]] = []
        self.halt = threading.Event()

    def _sample(self) -> tuple[int, int, tuple[int, ...]]:
        c, p, m = self.db.schema.consumers, self.db.schema.partitions, self.db.schema.messages
        with self.db.read() as conn:
            version = conn.execute(
                select(c.c.version).where(c.c.name == tally_app.CONSUMER)
            ).scalar_one()
            checkpoints = dict(
                conn.execute(
                    select(p.c.partition_no, p.c.checkpoint).where(
                        p.c.consumer == tally_app.CONSUMER
                    )
                ).all()
            )
            positions = conn.execute(
                select(m.c.position, m.c.partition_hash).where(
                    m.c.topic == tally_app.TOPIC,
                    m.c.position > min(checkpoints.values(), default=0),
                )
            ).all()
        count = len(checkpoints) or 1
        lag = sum(pos > checkpoints.get(hashed % count, 0) for pos, hashed in positions)
        return int(version or 1), lag, tuple(checkpoints[k] for k in sorted(checkpoints))

    def run(self) -> None:
        store, last_append = MessageStore(self.db), 0.0
        try:
            while not self.halt.wait(0.025):
                now = time.monotonic()
                if now - last_append >= 0.05:
                    with self.db.transaction() as conn:
                        for n in range(self.next, self.next + 3):
                            store.append(conn, tally_app.TOPIC, f"s{n}", [tally_app.Counted(n)])
                    self.next += 3
                    last_append = now
                self.samples.append((now, *self._sample()))
        finally:
            self.db.dispose()

    def stop(self) -> int:
        """Stop sampling and appending; return how many messages were appended."""
        self.halt.set()
        self.join(timeout=10)
        return self.next


def _longest_stall(samples: list[tuple[float, int, int, tuple[int, ...]]]) -> float:
    """The longest time the live version had messages to apply and none of its
    checkpoints moved (a cutover's swap counts as a move)."""
    longest, since, last = 0.0, None, None
    for at, version, lag, checkpoints in samples:
        moved = (version, checkpoints) != last
        last = (version, checkpoints)
        if lag == 0 or moved:
            since = at if lag else None
            continue
        since = at if since is None else since
        longest = max(longest, at - since)
    return longest


def test_a_rolling_deploy_under_traffic_keeps_the_live_version_current(
    db: Database, tmp_path: Path
) -> None:
    with TallyCluster(db, tmp_path, consumer=DEFAULTS) as cluster:
        cluster.start("a1", 1)
        cluster.start("b1", 1)
        cluster.append(200)
        cluster.wait_applied_by(1, "a1 and b1 to apply everything under v1")
        watch = Watch(db, cluster.appended)
        watch.start()
        try:
            time.sleep(2.0)  # the traffic's normal lag, measured before the deploy
            deployed = len(watch.samples)
            cluster.start("c2", 2)  # the rolling deploy: new instances first...
            cluster.start("d2", 2)
            wait_until(lambda: watch.samples[-1][1] == 2, timeout=60, what="version 2 live")
            cluster.stop("a1")  # ...then the old ones go
            cluster.stop("b1")
            time.sleep(1.0)
        finally:
            cluster.appended = watch.stop()
        cluster.wait_applied_by(2, "the new version to apply everything")
    before, during = watch.samples[:deployed], watch.samples[deployed:]
    normal = max(lag for _, _, lag, _ in before)
    worst = max(lag for _, _, lag, _ in during)
    stall_before, stall_during = _longest_stall(before), _longest_stall(during)
    print(
        f"\nlive lag: before the deploy at most {normal}, during it at most {worst}; "
        f"longest stall before {stall_before:.2f} s, during {stall_during:.2f} s "
        f"({len(during)} samples)"
    )
    # the cutover stops the live version for a moment: at most a second of traffic more
    assert worst <= 2 * normal + TRAFFIC_PER_SECOND, "the live version fell behind"
    assert stall_during < 1.0, "the live version went without progress for a second"
