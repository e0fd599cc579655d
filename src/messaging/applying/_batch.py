"""A batch to apply: the claims it commits, its rows, and how far the read behind it went."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from messaging._messages import Envelope
from messaging.distribution._ownership import Claim
from messaging.failures._parking import NewPark
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
    envelopes: dict[int, Envelope] = attrs.field(factory=dict, eq=False, repr=False)
    """The envelopes of :attr:`rows` loaded so far (shared with :meth:`rest`)."""

    def checkpoint(self, applied: Sequence[StoredRow]) -> int:
        """Where the claims' checkpoints go once ``applied`` (non-empty: the batch's rows
        up to some row, or from some row to its end) committed: past :attr:`through` when
        they reach the end of :attr:`rows`, else right after their last."""
        last: int = applied[-1][POSITION]
        return max(last, self.through) if self._reaches_end(applied) else last

    def rest(self, applied: Sequence[StoredRow]) -> Batch | None:
        """The batch of :attr:`rows` after ``applied`` (committed: a batch that committed
        between two of its messages, on SQLite), its claims' checkpoints moved; None when
        nothing is left."""
        if self.rows is None or self._reaches_end(applied):
            return None
        at = applied[-1][POSITION]
        after = next(i for i, row in enumerate(self.rows) if row[POSITION] == at) + 1
        claims = {p: attrs.evolve(c, checkpoint=at) for p, c in self.claims.items()}
        return Batch(claims, self.rows[after:], self.through, self.parks, self.envelopes)

    def _reaches_end(self, applied: Sequence[StoredRow]) -> bool:
        return not self.rows or applied[-1][POSITION] >= self.rows[-1][POSITION]


def split_lanes(
    claims: Mapping[int, Claim],
    rows: Sequence[StoredRow],
    partitions: int,
    lanes: int,
    size: int | None = None,
) -> list[Batch]:
    """``rows`` split into at most ``lanes`` batches of whole partitions, as even in rows as
    can be (the partition with most rows first, into the batch with fewest so far), each
    in position order and committing its checkpoints at the read's last position. The
    partitions without rows go with the batch with fewest rows (the first to end), so that
    the next read starts after them too. No rows, no batches. A batch of more than
    ``size`` rows keeps its first ``size`` and commits its checkpoints after the last of
    them (the rest are read again): a route consumer's lane applies ``batch-size``
    messages at most, so a crash repeats at most that many effects per lane.

    Which lane applies a partition is decided at each read, not fixed: with a few
    partitions per instance (8 of 128 among 16 instances), ``p % lanes`` gave some lanes
    none and others three, and those lanes applied a third of the instance's messages."""
    if not rows:
        return []
    counts: dict[int, int] = {}
    for row in rows:
        partition = row[PARTITION_HASH] % partitions
        counts[partition] = counts.get(partition, 0) + 1
    loads = [0] * min(lanes, len(counts))
    lane_of: dict[int, int] = {}
    for partition in sorted(counts, key=lambda p: (-counts[p], p)):
        lane = loads.index(min(loads))
        lane_of[partition] = lane
        loads[lane] += counts[partition]
    lightest = loads.index(min(loads))
    by_lane: list[list[StoredRow]] = [[] for _ in loads]
    for row in rows:
        by_lane[lane_of[row[PARTITION_HASH] % partitions]].append(row)
    through = rows[-1][POSITION]
    return [
        Batch(
            {p: c for p, c in claims.items() if lane_of.get(p, lightest) == lane},
            lane_rows[:size],
            through if size is None or len(lane_rows) <= size else lane_rows[size - 1][POSITION],
        )
        for lane, lane_rows in enumerate(by_lane)
    ]
