"""Parked sources on the simulated cluster (real instances, manual clock): whatever the order
of appends (some poisoned), handovers (crashes, clean stops, joins), retries, skips and
evictions, each source's messages are applied in their order and at most once; once every
handler is fixed and every parked source retried, each message is applied exactly once
unless an operator skipped or evicted it (then it is recorded as skipped, never applied)."""

from __future__ import annotations

from collections import Counter
from contextlib import suppress

from effort import examples
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from ranked_steps import FIXED, SOURCES, Step, Steps, applied
from sqlalchemy import select

from messaging import OperationError
from projections import _parked_ops as ops
from projections.testing import open_cluster, retry_parked_sources, simulation_settings


class ParkingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        FIXED.clear()
        self._context = open_cluster(
            [Steps], settings=simulation_settings(projections={"on-failure": "park-source"})
        )
        self.cluster = self._context.__enter__()
        self.db = self.cluster.db
        self.cluster.join()
        self.seqs: Counter[str] = Counter()
        self.steps: dict[int, tuple[str, int, bool]] = {}
        """Position → (source, seq, poison) of every message appended."""

    def teardown(self) -> None:
        FIXED.clear()
        self._context.__exit__(None, None, None)

    # -- the cluster ---------------------------------------------------------------------------

    @rule(source=st.sampled_from(SOURCES), count=st.integers(1, 3), poison=st.booleans())
    def append(self, source: str, count: int, poison: bool) -> None:
        steps = []
        for n in range(count):
            self.seqs[source] += 1
            steps.append(Step(source, self.seqs[source], poison and n == 0))
        positions = self.cluster.append("steps", source, steps)
        for position, step in zip(positions, steps, strict=True):
            self.steps[position] = (source, step.seq, step.poison)

    @rule()
    def join(self) -> None:
        self.cluster.join()

    @precondition(lambda self: len(self.cluster.running) > 1)
    @rule(crash=st.booleans(), pick=st.integers(0, 9))
    def leave(self, crash: bool, pick: int) -> None:
        names = sorted(self.cluster.running)
        name = names[pick % len(names)]
        (self.cluster.crash if crash else self.cluster.stop)(name)

    @rule()
    def poll(self) -> None:
        self.cluster.poll_all()

    @rule()
    def tick(self) -> None:
        self.cluster.tick()

    @rule()
    def settle(self) -> None:
        self.cluster.settle()

    # -- the operator --------------------------------------------------------------------------

    def _fix(self, source: str) -> None:
        FIXED.update((s, seq) for s, seq, poison in self.steps.values() if poison and s == source)

    def _command(self, command: str, source: str) -> None:
        with suppress(OperationError):  # not parked (or being retried): refused, nothing changed
            getattr(ops, command)(self.db, "parking-machine", source=source, who="machine")

    @rule(source=st.sampled_from(SOURCES), fix=st.booleans())
    def retry(self, source: str, fix: bool) -> None:
        if fix:
            self._fix(source)
        self._command("retry", source)

    @rule(source=st.sampled_from(SOURCES))
    def skip(self, source: str) -> None:
        self._command("skip", source)

    @rule(source=st.sampled_from(SOURCES))
    def evict(self, source: str) -> None:
        self._command("evict", source)

    # -- what must hold --------------------------------------------------------------------------

    def _applied(self) -> list[tuple[str, int, int, int]]:
        with self.db.read() as conn:
            columns = (applied.c.source, applied.c.seq, applied.c.position, applied.c.rank)
            return [(r[0], r[1], r[2], r[3]) for r in conn.execute(select(*columns))]

    @invariant()
    def each_source_in_order_at_most_once(self) -> None:
        rows = self._applied()
        assert len({(s, seq) for s, seq, _p, _r in rows}) == len(rows), "applied twice"
        by_source: dict[str, list[tuple[int, int]]] = {}
        for source, seq, _position, rank in rows:
            by_source.setdefault(source, []).append((rank, seq))
        for source, ranked in by_source.items():
            seqs = [seq for _rank, seq in sorted(ranked)]
            assert seqs == sorted(seqs), f"{source} applied out of order: {seqs}"

    def check_settled(self) -> None:
        """Fix every handler, retry every parked source until none is left: every message
        is applied once or recorded as skipped."""
        FIXED.update((s, seq) for s, seq, poison in self.steps.values() if poison)
        self.cluster.settle()
        retry_parked_sources(self.cluster, ["parking-machine"])
        report = ops.parked(self.db, "parking-machine", skipped=True)
        done = {position for _s, _seq, position, _r in self._applied()}
        skipped = {entry["position"] for entry in report["skipped"]}
        assert not done & skipped
        assert done | skipped == set(self.steps)


class SettledParkingMachine(ParkingMachine):
    def teardown(self) -> None:
        try:
            self.check_settled()
        finally:
            super().teardown()


def test_parking_keeps_each_source_in_order_and_once() -> None:
    run = SettledParkingMachine.TestCase
    run.settings = settings(
        max_examples=examples(25),
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    run().runTest()
