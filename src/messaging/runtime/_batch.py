"""A batch to apply: the claims it commits, its rows, and how far the read behind it went."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from messaging.distribution._ownership import Claim
from messaging.runtime._parking import NewPark
from messaging.store._rows import PARTITION_HASH, POSITION, StoredRow


@attrs.frozen
class Batch:
    """What one transaction applies and the checkpoints it commits.

    ``rows`` None: read inside the apply transaction (catching up). ``through``: the
    position the read behind ``rows`` went to, when it holds every message of ``claims``
    up to there (a lane's rows may end earlier): checkpoints move at least that far.
    ``parks``: sources the batch parks (their messages from there on are held back).
    """

    claims: Mapping[int, Claim]
    rows: Sequence[StoredRow] | None = None
    through: int = 0
    parks: tuple[NewPark, ...] = ()

    def checkpoint(self, applied: Sequence[StoredRow]) -> int:
        """Where the claims' checkpoints go once ``applied`` (non-empty) committed."""
        last: int = applied[-1][POSITION]
        return max(last, self.through)


def split_lanes(
    claims: Mapping[int, Claim],
    rows: Sequence[StoredRow],
    partitions: int,
    lanes: int,
    most: int,
) -> list[Batch]:
    """``rows`` split by lane (partition ``p`` is in lane ``p % lanes``), each
    lane's batch committing its checkpoints at the read's last position. The partitions
    of lanes without messages go with the first lane that has some, so that the next
    read starts after them too. No rows, no batches.

    Where several lanes have rows, each takes its first ``most`` at most (``batch-size``)
    and then commits at the last of them (the rest are read again): a lane behind the
    others, whose rows come first in the read, would otherwise take most of it, fall
    further behind, and leave the others short batches and a wait for it. A lane alone
    in the read takes all of it."""
    if not rows:
        return []
    by_lane: dict[int, list[StoredRow]] = {}
    for row in rows:
        by_lane.setdefault(row[PARTITION_HASH] % partitions % lanes, []).append(row)
    first = min(by_lane)
    through = rows[-1][POSITION]
    if len(by_lane) == 1:
        most = len(rows)
    return [
        Batch(
            {
                p: c
                for p, c in claims.items()
                if p % lanes == lane or (lane == first and p % lanes not in by_lane)
            },
            lane_rows[:most],
            through if len(lane_rows) <= most else lane_rows[most - 1][POSITION],
        )
        for lane, lane_rows in sorted(by_lane.items())
    ]
