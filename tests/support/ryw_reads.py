"""The reads of the read-your-writes runs (:mod:`waiting_appenders`): an account's entries
as an application reads them after a wait, and the diagnosis of a false applied."""

from __future__ import annotations

import time

import attrs
from ledger_waits import CONSUMER
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from messaging import Database, Progress
from messaging.distribution._ownership import Ownership
from messaging.store._retry import lock_conflict
from messaging.store._tokens import Appended
from projections.examples import ledger

ABORTED_READS = 10
"""Times a read aborted by a replicated RENAME (Galera's cutover, 1213) is read again."""
LATER = (0.2, 2.0)
"""Seconds after a false applied at which the diagnosis reads the account again."""


@attrs.frozen
class Reading:
    """Where an application reads the read model: ``db``'s node; ``causal``: with
    ``wsrep_sync_wait=1`` on the session first (Galera, a node other than the wait's)."""

    name: str
    db: Database
    causal: bool = False

    def balances(self, account: str | None = None) -> dict[str, int]:
        """Account → entries (of ``account`` only, if given), on a new transaction."""
        table = self.db.read_model(ledger.balances)
        query = select(table.c.account_id, table.c.entries)
        if account is not None:
            query = query.where(table.c.account_id == account)
        for attempt in range(ABORTED_READS + 1):
            try:
                with self.db.read() as conn:
                    if self.causal:
                        conn.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
                    return {str(a): int(e) for a, e in conn.execute(query)}
            except DBAPIError as exc:  # a cutover's RENAME aborted the read (Galera)
                if attempt == ABORTED_READS or lock_conflict(exc) != "deadlock":
                    raise
        raise AssertionError("unreachable")

    def entries(self, account: str) -> int:
        """The account's entries (0: no row yet)."""
        return self.balances(account).get(account, 0)


def diagnose(
    waiter: Database,
    reading: Reading,
    account: str,
    seen: int,
    written: int,
    appended: Appended,
    progress: Progress,
    waited: float,
) -> str:
    """What a false applied looked like (``reading`` showed ``seen`` of ``written`` entries
    after a wait on ``waiter`` answered ``progress``): the append's position, the
    partition's rows, the account's messages as the waiter's node has them, and the
    account read again :data:`LATER` (transient: a visibility gap; permanent: a skipped
    message)."""
    _, hashed, position = appended.token.marks[-1]
    lines = [
        f"false applied: {account} shows {seen} of {written} on {reading.name} after a wait "
        f"of {waited:.3f}s answered {progress!r}",
        f"the append: positions {list(appended)}, token marks {appended.token.marks}",
        *_store(waiter, account, hashed, position),
    ]
    again, slept = [], 0.0
    for at in LATER:  # a diagnosis: how the same read looks later, not a synchronisation
        time.sleep(at - slept)
        slept = at
        again.append(reading.entries(account))
    verdict = (
        "transient (a visibility gap)" if again[-1] >= written else "permanent (a skipped message?)"
    )
    lines.append(
        "read again: "
        + ", ".join(f"{n} after {at}s" for n, at in zip(again, LATER, strict=True))
        + f": {verdict}"
    )
    lines.append(f"{LATER[-1]}s later, " + _store(waiter, account, hashed, position)[1])
    return "\n  ".join(lines)


def _store(db: Database, account: str, hashed: int | None, position: int) -> list[str]:
    """The live version and its partition count; the rows of the partition ``position``
    falls into, of every version; the account's messages and the committed head."""
    c, m, i = db.schema.consumers, db.schema.messages, db.schema.instances
    with db.read() as conn:
        live = conn.execute(
            select(c.c.version, c.c.partitions, c.c.state, c.c.cutover).where(
                c.c.tenant == db.tenant, c.c.name == CONSUMER
            )
        ).one()
        partition = None if hashed is None else hashed % int(live.partitions)
        names = {
            str(r.id): str(r.name)
            for r in conn.execute(select(i.c.id, i.c.name).where(i.c.tenant == db.tenant))
        }
        rows = [
            f"{r.consumer}#{r.partition} checkpoint {r.checkpoint} (position {position}: "
            f"{'past' if r.checkpoint >= position else 'BEHIND'}), epoch {r.epoch}, owner "
            f"{names.get(r.owner or '', r.owner)}, {r.status}"
            for r in Ownership(db).partitions(conn)
            if (r.consumer == CONSUMER or r.consumer.startswith(f"{CONSUMER}@"))
            and partition in (None, r.partition)
        ]
        stored = conn.execute(
            select(m.c.position)
            .where(m.c.tenant == db.tenant, m.c.topic == ledger.TOPIC, m.c.source == account)
            .order_by(m.c.position)
        ).scalars()
        positions = [int(p) for p in stored]
        head = conn.execute(
            select(db.schema.positions.c.last_position).where(
                db.schema.positions.c.tenant == db.tenant
            )
        ).scalar_one()
    return [
        f"live version {live.version or 1} ({live.state}, cutover {live.cutover}), "
        f"{live.partitions} partitions: the append is in partition {partition}",
        "partition rows: " + "; ".join(rows),
        f"the account's messages on the waiter's node: {len(positions)}, the last at "
        f"{positions[-5:]}; committed head {head}",
    ]
