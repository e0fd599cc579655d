"""A batch read stays an index range as the stream grows: for 4 of 16 partitions it
examines the rows of its position range (about 4 per row returned, since the other 12
partitions' rows lie between them), wherever the checkpoint is. MariaDB once walked the
topic's index from its first message for a checkpoint near the end (a ``ref`` on
``(tenant, topic)`` with the position checked row by row): 200,000 index entries checked
for 248 rows on this table; ``benchmarks/reads.py`` measures it on 10 million."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from messaging import Database, MessageStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import reads

pytestmark = pytest.mark.mysql

MESSAGES = 200_000


@pytest.mark.parametrize("where", ["start", "middle", "end", "head"])
def test_a_batch_read_examines_its_position_range_only(db: Database, where: str) -> None:
    reads.fill(db, MESSAGES, chunk=MESSAGES)
    after = dict(reads.positions(MESSAGES))[where]
    cost = reads.read_cost(db, MessageStore(db), after, reads=1)
    (plan,) = cost.plan
    assert (plan["type"], plan["key"]) == ("range", f"{db.schema.prefix}ix_messages_topic")
    if where in ("start", "middle"):
        assert cost.returned == reads.BATCH
    elif where == "end":
        assert 0 < cost.returned < reads.BATCH
    else:
        assert cost.returned == 0
    # Rows of the other partitions between those returned, and nothing before them.
    bound = 1.1 * reads.PARTITIONS / len(reads.OWNED) * cost.returned + 10
    checked = max(cost.examined, cost.handler.get("Handler_icp_attempts", 0))
    assert checked <= bound, cost.handler
