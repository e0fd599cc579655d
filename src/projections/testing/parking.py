"""Steps that poison sources, for a :class:`ClusterMachine` whose consumers park them.

Mix :class:`ParkingSteps` into a machine (``class M(ParkingSteps, ClusterMachine)``), set
``poison_topics`` (topics read only by consumers configured ``on-failure: park-source``,
and by no saga: a saga cannot tell which instance an unreadable message is for) and
``cluster_settings`` that say ``park-source``. Its search then also appends messages that
fail (their stored payload is made unreadable right after the append: a stand-in for a
handler that fails on them), fixes them (the payload is put back, as a fixed handler or a
deployed upcaster would make them readable), and has an operator retry parked sources,
fixed or not, among whatever cluster events come between. After every settle, each
poisoned message is fixed and every parked source retried until none is left, then the
machine's own checks run: every message committed once, and the read models equal to the
expected state, which a held message lost or applied twice, or a source applied out of
its order, breaks (make :meth:`ClusterMachine.expected` order-sensitive per source, e.g.
a refused withdrawal, to see the last).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from sqlalchemy import select, update

from messaging import Appended, OperationError, WaitRefused
from projections import _parked_ops as ops
from projections.testing.cluster import SimulatedCluster
from projections.testing.events import Append
from projections.testing.parked import parked_sources, retry_parked_sources
from projections.testing.strategies import picks
from projections.testing.waiting import wait_in

UNREADABLE = '{"poisoned by the testing kit": '
"""The payload a poisoned message is stored with until it is fixed (not JSON)."""

_poisonable = st.runner().flatmap(
    lambda machine: machine.messages.filter(lambda batch: batch.topic in machine.poison_topics)
)
"""The machine's own appends, of the topics it may poison."""


class ParkingSteps(RuleBasedStateMachine):
    """Poison, fix and retry steps (mixed into a ``ClusterMachine``; see the module)."""

    cluster: SimulatedCluster
    poison_topics: ClassVar[Sequence[str]] = ()
    """The topics whose messages the steps may poison."""

    @property
    def poisoned(self) -> dict[int, str]:
        """Position → the stored payload of each poisoned message not fixed yet."""
        found: dict[int, str] = self.__dict__.setdefault("_poisoned_payloads", {})
        return found

    def parking_consumers(self) -> list[str]:
        """The consumers that read a topic the steps may poison."""
        topics = set(self.poison_topics)
        return [s.name for s in self.cluster.specs if topics & set(s.topics) and s.kind.parks]

    @precondition(lambda self: self.poison_topics)
    @rule(batch=_poisonable)
    def append_poisoned(self, batch: Append) -> None:
        """Append ``batch``; its first message fails to be read until fixed."""
        self._append_poisoned(batch)

    @precondition(lambda self: self.poison_topics and self.cluster.running)
    @rule(batch=_poisonable)
    def wait_after_a_retry(self, batch: Append) -> None:
        """Append ``batch`` poisoned and settle; once its source is parked, fix every
        poisoned message, have an operator retry the source and settle: a wait on the
        batch must then answer applied, not be refused (or, in a real cluster, end at its
        deadline: ``tests/integration/test_parked_waits.py``)."""
        appended = self._append_poisoned(batch)
        self.cluster.settle()
        names = self.parking_consumers()
        found = parked_sources(self.cluster, names)
        parked = [name for name, source in found if source == batch.source]
        if not parked:  # its partition halted (max-parked-sources), or nothing read it
            return
        self._fix(sorted(self.poisoned))
        for name in parked:
            with suppress(OperationError):  # being retried already
                ops.retry(self.cluster.db, name, source=batch.source, who="testing kit")
        self.cluster.settle()
        try:
            wait_in(self.cluster, appended.token, names)
        except WaitRefused as refused:
            raise AssertionError(
                f"a wait after the retry of source {batch.source!r} was refused: {refused}"
            ) from refused

    def _append_poisoned(self, batch: Append) -> Appended:
        db = self.cluster.db
        appended = self.cluster.append(batch.topic, batch.source, batch.messages)
        position = appended[0]
        m = db.schema.messages
        mine = (m.c.tenant == db.tenant, m.c.position == position)
        with db.transaction() as conn:
            self.poisoned[position] = conn.execute(select(m.c.payload).where(*mine)).scalar_one()
            conn.execute(update(m).where(*mine).values(payload=UNREADABLE))
        self.cluster.note(f"the message at position {position} is poisoned")
        return appended

    @precondition(lambda self: self.poisoned)
    @rule(pick=picks())
    def fix_poisoned(self, pick: int) -> None:
        """One poisoned message is readable again (a parked source stays parked)."""
        positions = sorted(self.poisoned)
        self._fix([positions[pick % len(positions)]])

    def _fix(self, positions: Sequence[int]) -> None:
        db, m = self.cluster.db, self.cluster.db.schema.messages
        with db.transaction() as conn:
            for position in positions:
                conn.execute(
                    update(m)
                    .where(m.c.tenant == db.tenant, m.c.position == position)
                    .values(payload=self.poisoned.pop(position))
                )
        self.cluster.note(f"the messages at positions {list(positions)} are fixed")

    @rule(pick=picks())
    def retry_parked(self, pick: int) -> None:
        """An operator retries one parked source, fixed or not (one still failing parks
        again at its failing message, after applying those before it)."""
        parked = parked_sources(self.cluster, self.parking_consumers())
        if parked:
            name, source = parked[pick % len(parked)]
            with suppress(OperationError):  # being retried already
                ops.retry(self.cluster.db, name, source=source, who="testing kit")

    def check_settled(self) -> None:
        """Fix every poisoned message and retry every parked source, then the machine's
        checks after settling."""
        self._fix(sorted(self.poisoned))
        retry_parked_sources(self.cluster, self.parking_consumers())
        machine: Any = super()
        machine.check_settled()
