"""The battery: short fixed scenarios that every correct consumer survives and each
known kind of consumer bug fails at once, run before the random search.

Each scenario drives a fresh :class:`~projections.testing.machine.ClusterMachine` through
a few of its own steps (the same methods Hypothesis calls), with the messages the
machine's strategy gives first (its simplest appends). A failure says, in a sentence,
which scenario failed, what kind of bug that means, and what differed after which
step, followed by the program that replays it and the cluster scenario.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Protocol

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample
from hypothesis.stateful import INVARIANT_MARKER
from hypothesis.strategies import SearchStrategy

from messaging.kinds import ConsumerSpec, partition_of
from messaging.operations import collect_specs
from projections.testing.differences import ReadModelDiffers
from projections.testing.events import Append
from projections.testing.protocols import Machine


@attrs.define(frozen=True)
class Samples:
    """The appends a scenario uses: the simplest the machine's strategy gives, and the
    simplest of another source (None when every append has one source)."""

    first: Append
    other: Append | None


def samples_of(messages: SearchStrategy[Append]) -> Samples:
    """The simplest appends of ``messages`` (deterministic: no randomness, no database)."""
    quiet = settings(
        database=None,
        derandomize=True,
        max_examples=200,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    first = find(messages, lambda _: True, settings=quiet)
    try:
        other = find(messages, lambda batch: batch.source != first.source, settings=quiet)
    except NoSuchExample:
        other = None
    return Samples(first, other)


class BatteryFailure(AssertionError):
    """A scenario of the battery failed; the message says which, why, and how to replay it."""


class Run:
    """One scenario's run: the machine, its samples, the steps so far as a program."""

    def __init__(self, scenario: Scenario, machine: Machine, samples: Samples) -> None:
        self.scenario = scenario
        self.machine = machine
        self.cluster = machine.cluster
        self.samples = samples
        self.program = [f"state = {type(machine).__name__}()"]

    # -- steps ------------------------------------------------------------------------------

    def call(self, step: str, **arguments: object) -> None:
        """Call the machine's ``step`` method, then its invariants, as Hypothesis would."""
        shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        self.program.append(f"state.{step}({shown})")
        getattr(self.machine, step)(**arguments)
        self.check_invariants()

    def check_invariants(self) -> None:
        for _, member in inspect.getmembers(type(self.machine)):
            found = getattr(member, INVARIANT_MARKER, None)
            if found is not None and all(p(self.machine) for p in found.preconditions):
                found.function(self.machine)

    def pick(self, name: str, among: Iterable[str]) -> int:
        """The ``pick`` that chooses instance ``name`` among ``among``."""
        return sorted(among).index(name)

    def settle(self, after: str, meaning: str | None = None) -> None:
        """Settle and check; a failure explains itself as ``meaning`` (default: the
        scenario's) that showed ``after`` the steps described."""
        self.checked("settle", after, meaning)

    def checked(
        self, step: str, after: str, meaning: str | None = None, **arguments: object
    ) -> None:
        """Call a step (with ``arguments``) and the invariants; turn a failure of either into
        a sentence."""
        try:
            self.call(step, **arguments)
        except AssertionError as failed:
            raise self.failure(failed, after, meaning) from failed

    def failure(self, failed: AssertionError, after: str, meaning: str | None) -> BatteryFailure:
        if isinstance(failed, ReadModelDiffers):
            what = "; ".join(d.sentence(failed.template) for d in failed.differences[:3])
            if len(failed.differences) > 3:
                what += f" (and {len(failed.differences) - 3} more keys differ)"
        else:
            what = str(failed)
        sentence = f"{meaning or self.scenario.meaning}: after {after}, {what}"
        return BatteryFailure(
            f"the battery's scenario {self.scenario.name!r} failed: {sentence}\n"
            "Replay it (with every check) in a test:\n"
            + "\n".join([*self.program, "state.teardown()"])
            + "\nCluster scenario (calls on the SimulatedCluster, what each caused below it):\n"
            + self.cluster.scenario()
        )

    # -- what the steps did, in words ------------------------------------------------------

    def partitions_of(self, batch: Append) -> list[tuple[str, int]]:
        """(consumer, partition) of every transactional consumer reading ``batch``."""
        return [
            (spec.name, partition_of(batch.source, spec.partitions))
            for spec in self.cluster.specs
            if spec.transactional and batch.topic in spec.topics
        ]

    def rounds(self) -> int:
        """Rebalance rounds after which a failed instance has been replaced."""
        consumer = self.cluster.settings.messaging.consumer
        return math.ceil(self.cluster.handover_bound / consumer.rebalance_interval)

    def move_everything(self) -> str:
        """Join a fresh instance, stop every other one, let the fresh one take everything;
        say which partitions of the first sample's source went where."""
        before = self.cluster.owners()
        old = sorted(self.cluster.running)
        self.call("join")
        fresh = next(name for name in self.cluster.running if name not in old)
        for name in old:
            self.call("stop", pick=self.pick(name, self.cluster.running))
        self.call("tick", times=self.rounds())
        after = self.cluster.owners()
        moves = ", ".join(
            f"partition {p} of {c} from {before[c, p]} to {after[c, p]}"
            for c, p in self.partitions_of(self.samples.first)
        )
        return (
            f"every partition moved from {', '.join(old)} to a fresh instance {fresh} "
            f"({moves}, holding {self.samples.first.source})"
        )


def _always(specs: Sequence[ConsumerSpec], samples: Samples) -> bool:
    return True


@attrs.define(frozen=True)
class Scenario:
    """A fixed scenario: ``steps`` drive a :class:`Run` and check it; ``meaning`` names
    the kind of bug its failure shows; it runs only where ``applies`` (the consumers'
    specs, the samples) says so."""

    name: str
    meaning: str
    steps: Callable[[Run], None]
    applies: Callable[[Sequence[ConsumerSpec], Samples], bool] = _always


def _start(run: Run) -> None:
    if not run.cluster.running:  # a machine may start with no instance (initial_instances = 0)
        run.call("join")
    run.settle(
        "the initial appends were applied",
        "the read model is wrong before anything happens to the cluster",
    )


def _handover(run: Run) -> None:
    """The source gets its messages twice before the move and once after it: were it only
    once before, a fresh instance that fails its first attempt at the batch (a cached
    "insert" of a row that exists) and retries it with the state that attempt left in
    memory would write what a correct consumer writes."""
    batch = run.samples.first
    _start(run)
    for _ in range(2):
        run.call("append", batch=batch)
        run.settle(f"{batch.source} got {len(batch.messages)} message(s)")
    moved = run.move_everything()
    run.call("append", batch=batch)
    run.settle(f"{moved}, and {batch.source} got the same message(s) a third time")


def _rolled_back(run: Run) -> None:
    """Each hop of a flow rolled back once: the batch with the sample is applied, rolled
    back and applied again; so is then the batch of each consumer that the messages its
    handlers sent reach (a saga's command to a route consumer, its reply...)."""
    batch = run.samples.first
    _start(run)
    run.call("append", batch=batch)
    rolled = (
        f"the batch with {batch.source}'s message(s), and then the batch of each consumer "
        "its effects reached, was applied, rolled back (its fence had moved on) and "
        "applied again"
    )
    for _ in range(_HOPS):
        run.call("roll_back")
        run.call("tick", times=run.rounds())  # the paused partitions claimed again
        run.checked("poll_hop", rolled)  # what it sends is left for the next hop's roll-back
    run.settle(rolled)


_HOPS = 4
"""Consumers along a flow whose batches the rolled-back scenario rolls back in turn."""


def _zombie(run: Run) -> None:
    batch = run.samples.first
    _start(run)
    if len(run.cluster.running) < 2:
        run.call("join")
    run.call("append", batch=batch)
    consumer, partition = run.partitions_of(batch)[0]
    owner = run.cluster.owners()[consumer, partition]
    assert owner is not None, f"partition {partition} of {consumer} has no owner after settling"
    run.call("pause", pick=run.pick(owner, run.cluster.running))
    run.call("tick", times=run.rounds())
    successor = run.cluster.owners()[consumer, partition]
    run.call("poll")
    run.call("wake", pick=0)
    run.settle(
        f"{owner} froze with {batch.source}'s message(s) pending, {successor} took partition "
        f"{partition} of {consumer} over and applied them, and {owner} woke up and applied "
        "them again as a zombie (rolled back: its fence had moved on)"
    )


def _crash(run: Run) -> None:
    batch = run.samples.first
    _start(run)
    run.call("append", batch=batch)
    consumer, partition = run.partitions_of(batch)[0]
    owner = run.cluster.owners()[consumer, partition]
    assert owner is not None, f"partition {partition} of {consumer} has no owner after settling"
    run.call("crash_during_commit", pick=run.pick(owner, run.cluster.running))
    run.call("join")
    run.settle(
        f"{owner} died in the middle of the batch with {batch.source}'s message(s) (nothing "
        f"committed) and partition {partition} of {consumer} restarted from its checkpoint "
        "elsewhere"
    )


def _rebuild(run: Run) -> None:
    first, other = run.samples.first, run.samples.other
    _start(run)
    run.call("append", batch=first)
    if other is not None:
        run.call("append", batch=other)
    run.call("tick", times=1)
    run.call("append", batch=first)
    run.call("poll_last_first")
    run.settle("messages of several sources were applied, partition by partition")
    run.checked(
        "rebuild",
        "it was built message by message and then rebuilt from the start (later, in "
        "another order of partitions)",
    )


def _deadline_takeover(run: Run) -> None:
    batch = run.samples.first
    _start(run)
    run.call("append", batch=batch)
    run.call("poll")
    moved = run.move_everything()
    run.settle(
        f"a saga handled {batch.source}'s message(s) and {moved} before its deadlines fell due"
    )


def _sent_twice(run: Run) -> None:
    batch = run.samples.first
    _start(run)
    run.call("append", batch=batch)
    run.settle(f"{len(batch.messages)} message(s) were sent to {batch.topic}")
    run.call("resend", pick=0)
    run.settle(
        f"the first message sent to {batch.topic} was sent again under its message id (as a "
        "sender retrying after an unknown outcome does)"
    )


def _owner_of(run: Run, batch: Append) -> str:
    """The running instance that applies ``batch``'s first partition."""
    consumer, partition = run.partitions_of(batch)[0]
    owner = run.cluster.owners()[consumer, partition]
    assert owner in run.cluster.running, (
        f"partition {partition} of {consumer} has no running owner after settling"
    )
    return owner


def _lost_ack(run: Run) -> None:
    batch = run.samples.first
    _start(run)
    twice = (
        "a batch whose acknowledgement was lost took effect twice or not at all (the "
        "framework must re-read its claims and go on)"
    )
    run.call("append", batch=batch)
    owner = _owner_of(run, batch)
    lost = (
        f"{owner} committed the batch with {batch.source}'s message(s) and lost the "
        "acknowledgement (its worker saw only a lost connection)"
    )
    run.checked("lose_ack", lost, twice, pick=run.pick(owner, run.cluster.running), committed=True)
    run.settle(lost, twice)
    run.call("append", batch=batch)
    owner = _owner_of(run, batch)
    retried = (
        f"{owner} lost its connection while committing the batch with {batch.source}'s "
        "message(s) (rolled back, outcome unknown to it) and, finding its checkpoint "
        "unmoved, applied the batch again at once"
    )
    left_behind = (
        "a batch retried after an error of unknown outcome left the effects of its "
        "rolled-back attempt behind (writes outside the transaction, or state kept in "
        "the instance)"
    )
    pick = run.pick(owner, run.cluster.running)
    run.checked("lose_ack", retried, left_behind, pick=pick, committed=False)
    run.settle(retried, left_behind)


def _has(kind: str) -> Callable[[Sequence[ConsumerSpec], Samples], bool]:
    def applies(specs: Sequence[ConsumerSpec], samples: Samples) -> bool:
        return any(s.kind.value == kind and samples.first.topic in s.topics for s in specs)

    return applies


BATTERY: tuple[Scenario, ...] = (
    Scenario(
        "handover",
        "the consumer depends on state kept in the instance",
        _handover,
        lambda specs, samples: any(s.transactional for s in specs),
    ),
    Scenario(
        "rolled-back batch",
        "an effect of a rolled-back batch survived, or applying a batch again is not "
        "harmless (writes outside the transaction, or state kept in the instance)",
        _rolled_back,
        lambda specs, samples: any(s.transactional for s in specs),
    ),
    Scenario(
        "rebuild",
        "the read model depends on when, where or in which order it is built (the wall "
        "clock, randomness, messages of other partitions, or state kept in the instance, "
        "which a rebuild does not reset)",
        _rebuild,
        _has("projection"),
    ),
    Scenario(
        "zombie",
        "a zombie's rolled-back batch left effects behind (writes outside the transaction)",
        _zombie,
        lambda specs, samples: any(s.transactional for s in specs),
    ),
    Scenario(
        "crash mid-batch",
        "a batch that never committed left effects behind, or the restarted partition "
        "lacks state the dead instance kept (writes outside the transaction, state kept "
        "in the instance)",
        _crash,
        lambda specs, samples: any(s.transactional for s in specs),
    ),
    Scenario(
        "deadlines across a takeover",
        "the saga's deadlines depend on state kept in the instance",
        _deadline_takeover,
        _has("saga"),
    ),
    Scenario(
        "sent twice",
        "the route consumer is not idempotent: a message sent twice took effect twice "
        "(declare it with idempotent=True, or make its handler idempotent)",
        _sent_twice,
        _has("route-consumer"),
    ),
    Scenario(
        "lost acknowledgement",
        "a batch whose commit had an unknown outcome took effect twice, or not at all",
        _lost_ack,
        lambda specs, samples: any(
            s.transactional and samples.first.topic in s.topics for s in specs
        ),
    ),
)
"""The default battery, in the order it runs. The lost acknowledgement runs last: the
consumer bugs it shows (writes outside the transaction, state kept in the instance) the
earlier scenarios show too; it checks first of all the framework's own promise that a
batch whose commit had an unknown outcome takes effect exactly once."""


class BatteryMachine(Machine, Protocol):
    """A machine with its battery of scenarios (``ClusterMachine.battery``)."""

    battery: ClassVar[Sequence[Scenario]]


def run_battery(machine: type[BatteryMachine], database_url: str | None = None) -> None:
    """Run ``machine.battery``, each applicable scenario on a fresh machine; raise
    :class:`BatteryFailure` for the first that fails."""
    samples = samples_of(machine.messages)
    specs = collect_specs(list(machine.consumers))
    for scenario in machine.battery:
        if not scenario.applies(specs, samples):
            continue
        state = machine(database_url)
        try:
            scenario.steps(Run(scenario, state, samples))
        finally:
            state.teardown()
