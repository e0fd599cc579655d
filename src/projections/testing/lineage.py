"""Which commits are a projection's live version's, across rebuilds: while a new version
is built its commits are ``NAME@N``'s and the old version's go on under ``NAME``; from
its cutover on, ``NAME``'s are the new version's (:mod:`messaging.runtime._versions`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, MutableMapping, Sequence

from messaging.runtime._versions import split_unit, unit_rows
from messaging.store._database import Database
from projections.testing.records import Commit


class Lineage:
    """When each projection was last rebuilt and when its new version took over."""

    def __init__(self) -> None:
        self.rebuilt_at: dict[str, int] = {}
        """Projection → how many commits there were when it was last rebuilt."""
        self.cut_at: dict[str, int] = {}
        """Projection → how many commits there were when its new version took over."""
        self.live: dict[str, int] = {}
        """Projection → its live version, as last seen."""

    def rebuilt(self, name: str, commits: int) -> None:
        self.rebuilt_at[name] = commits

    def observe(
        self,
        db: Database,
        names: Iterable[str],
        commits: int,
        checkpoints: MutableMapping[tuple[str, int], int],
    ) -> None:
        """Note each cutover since last seen, forgetting the ``checkpoints`` seen of the
        projection (its partitions are the new version's now)."""
        with db.read() as conn:
            rows = unit_rows(db, conn, names)
        for row in (r for r in rows if r.live):
            if self.live.setdefault(row.name, row.version) != row.version:
                self.live[row.name] = row.version
                self.cut_at[row.name] = commits
                for key in [k for k in checkpoints if split_unit(k[0])[0] == row.name]:
                    del checkpoints[key]

    def committed(self, commits: Sequence[Commit]) -> Counter[str]:
        """Per consumer, the messages its live version committed since it was built."""
        committed: Counter[str] = Counter()
        for index, commit in enumerate(commits):
            name, version = split_unit(commit.consumer)
            rebuilt, cut = self.rebuilt_at.get(name), self.cut_at.get(name, -1)
            if rebuilt is None:
                counts = True
            elif version is not None:  # the new version, while it was built
                counts = index >= rebuilt
            else:  # the live version: the new one, once it took over
                counts = cut >= rebuilt and index >= cut
            if counts:
                committed[name] += commit.count
        return committed
