"""Which commits are a projection's live version's, across rebuilds and rollbacks: each
commit records the version it was made for (:class:`~projections.testing.records.Commit`),
and a version's commits, while it was built (as ``NAME@N``) and while live (as ``NAME``),
must hold every message once (:mod:`messaging.versions._versions`). A rollback's version
goes on from its own earlier commits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, MutableMapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from messaging import Database
from messaging.operations import split_unit, unit_rows
from projections.testing.records import Commit

if TYPE_CHECKING:
    from projections.testing.cluster import SimulatedCluster


def handled(cluster: SimulatedCluster) -> Counter[str]:
    """Per transactional consumer, how many messages in the store it handles: those
    appended (or sent again) to ``cluster`` and those its consumers' handlers sent, which
    are stored once per committed batch (a batch rolled back sent nothing)."""
    m = cluster.db.schema.messages
    with cluster.db.read() as conn:
        stored = conn.execute(
            select(m.c.topic, m.c.type, func.count())
            .where(m.c.tenant == cluster.db.tenant)
            .group_by(m.c.topic, m.c.type)
        ).all()
    counts: Counter[str] = Counter()
    for spec in cluster.specs:
        if spec.transactional:
            types = set(spec.stored_type_names())
            counts[spec.name] = sum(
                n for topic, type_name, n in stored if topic in spec.topics and type_name in types
            )
    return counts


class Lineage:
    """The live version of each projection, as last seen."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        """Projection → its live version, as last seen."""

    def observe(
        self, db: Database, names: Iterable[str], checkpoints: MutableMapping[tuple[str, int], int]
    ) -> None:
        """Note each cutover since last seen, forgetting the ``checkpoints`` seen of the
        projection (its partitions are another version's now)."""
        with db.read() as conn:
            rows = unit_rows(db, conn, names)
        for row in (r for r in rows if r.live):
            if self.live.setdefault(row.name, row.version) != row.version:
                self.live[row.name] = row.version
                for key in [k for k in checkpoints if split_unit(k[0])[0] == row.name]:
                    del checkpoints[key]

    def by_version(self, commits: Sequence[Commit]) -> Counter[tuple[str, int]]:
        """Per (consumer, version), the messages committed."""
        counts: Counter[tuple[str, int]] = Counter()
        for commit in commits:
            counts[split_unit(commit.consumer)[0], commit.version] += commit.count
        return counts

    def committed(self, commits: Sequence[Commit]) -> Counter[str]:
        """Per consumer, the messages its live version (as last seen) committed."""
        return Counter(
            {
                name: count
                for (name, version), count in self.by_version(commits).items()
                if self.live.get(name, 1) == version
            }
        )
