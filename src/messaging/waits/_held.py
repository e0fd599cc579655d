"""What of a consistency token a consumer holds back, though its checkpoints pass it: the
messages of a parked source (``on-failure: park-source``, :mod:`messaging.failures._parking`)
and the messages an operator skipped. A checkpoint past them does not mean they were
applied, so :func:`~messaging.waits._progress.progress` asks here first.

- A position an operator skipped is never applied unless retried: waiting is refused
  (behind while its source's skipped messages are being retried).
- A mark whose source hash is a parked source's (parked at or before the mark's position)
  is held back: refused while the source is ``parked`` (only an operator's retry applies
  it); behind while it is being retried.
- A mark without a source hash (a token of more than 64 sources names none) cannot tell
  whether its messages are a parked source's: behind while a source of the partition is
  parked at or before it, so the wait times out naming it, never answers "applied".
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import attrs
from sqlalchemy import Connection, select

from messaging._errors import WaitRefused
from messaging.failures._parking import PARKED, RETRYING_SKIPPED
from messaging.store._database import Database
from messaging.store._rows import partition_hash
from messaging.store._tokens import Mark


def _retry_command(consumer: str, source: str, *options: str) -> str:
    """The operator's command that applies ``source``'s held messages, quoted for a shell."""
    return shlex.join(["projections", "retry", consumer, "--source", source, *options])


@attrs.frozen
class _Parked:
    source: str
    hash: int
    position: int
    state: str
    error: str


@attrs.frozen
class Held:
    """The parked sources and skipped positions of the consumers waited on."""

    parked: dict[tuple[str, int], list[_Parked]]
    """(consumer, partition) → its parked sources."""
    skipped: dict[tuple[str, int], tuple[str, str]]
    """(consumer, position) of a token's mark → (who skipped it, its source)."""

    def partitions(self, consumer: str, partitions: int, marks: Sequence[Mark]) -> dict[int, str]:
        """Partition → why it holds back some of ``marks`` (of the consumer's topics),
        for the partitions that still apply them later; :class:`WaitRefused` for a mark
        that only an operator can have applied."""
        held: dict[int, str] = {}
        for _topic, h, position in marks:
            skipped = self.skipped.get((consumer, position))
            if skipped is not None:
                who, source = skipped
                retried = [
                    p
                    for (name, p), rows in self.parked.items()
                    if name == consumer
                    for parked in rows
                    if parked.source == source and parked.state == RETRYING_SKIPPED
                ]
                if retried:
                    held[retried[0]] = f"source {source!r} retrying its skipped messages"
                    continue
                raise WaitRefused(
                    f"{consumer} skipped position {position} ({who} skipped it): it is "
                    "never applied unless an operator retries it "
                    f"({_retry_command(consumer, source, '--skipped')})"
                )
            for p in range(partitions) if h is None else [h % partitions]:
                for parked in self.parked.get((consumer, p), ()):
                    if parked.position > position or (h is not None and parked.hash != h):
                        continue
                    if h is not None and parked.state == PARKED:
                        raise WaitRefused(
                            f"{consumer} partition {p} holds back source {parked.source!r}, "
                            f"parked at position {parked.position} ({parked.error}): its "
                            "messages apply only once an operator retries it "
                            f"({_retry_command(consumer, parked.source)})"
                        )
                    why = "retrying" if parked.state != PARKED else "parked"
                    held[p] = f"source {parked.source!r} {why} from position {parked.position}"
        return held


def held(
    db: Database, conn: Connection, consumers: Sequence[str], positions: Sequence[int]
) -> Held:
    """The parked sources of ``consumers`` and which of ``positions`` they skipped (two
    indexed reads; both tables are empty unless something failed)."""
    t, s = db.schema.parked, db.schema.skipped
    parked: dict[tuple[str, int], list[_Parked]] = {}
    for row in conn.execute(
        select(
            t.c.consumer, t.c.partition_no, t.c.source, t.c.position, t.c.state, t.c.error
        ).where(t.c.tenant == db.tenant, t.c.consumer.in_(consumers))
    ):
        error = ((row.error or "").splitlines() or [""])[0]
        parked.setdefault((row.consumer, int(row.partition_no)), []).append(
            _Parked(row.source, partition_hash(row.source), int(row.position), row.state, error)
        )
    skipped = (
        {
            (row.consumer, int(row.position)): (row.who, row.source)
            for row in conn.execute(
                select(s.c.consumer, s.c.position, s.c.who, s.c.source).where(
                    s.c.tenant == db.tenant,
                    s.c.consumer.in_(consumers),
                    s.c.position.in_(list(positions)),
                )
            )
        }
        if positions
        else {}
    )
    return Held(parked, skipped)
