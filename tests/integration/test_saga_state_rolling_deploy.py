"""A rolling deploy that changes a saga's state class, on real ``projections run``
processes, with a thousand saga instances in flight and their messages still being
appended while the older instance stops.

- Done right (``state_version=2`` and a ``@state_upcaster`` from version 1), adding a
  required field or renaming one: the newer instance upcasts the older states; every
  instance ends exactly as a sequential model of the appended messages says, none lost,
  none twice, and no partition halts.
- Done wrongly (a required field added without a state version): only the partitions
  holding states the new code cannot read halt, each with one line naming the saga
  instance, the field and the fix; the others go on; nothing is lost: once the fix is
  deployed and the partitions resumed, every instance ends as the model says.
- An older instance that gets back partitions whose states the newer code wrote (the
  newer instance restarted mid-deploy) leaves them to an instance that reads them, and
  once one has applied them nothing says they still wait.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from clusters import cli, lag, owned_by, owners, start_instance, stop_instance, wait_until
from clusters import write_config as cluster_config
from forked import Process
from orders_state_shared import DONE, PARTITIONS, SAGA, STEPS, TOPIC, OrderOpened, OrderStep
from sqlalchemy import func, select

from messaging import Database, MessageStore
from messaging._settings import ConsumerSettings
from messaging.distribution._ownership import Ownership, PartitionRow
from messaging.store._rows import partition_of
from projections._reports import consumers_report

pytestmark = pytest.mark.multiprocess

SAGAS = 1000
"""Saga instances in flight when the deploy starts."""
FRESH = 200
"""Instances the unversioned code opens after the older instance stopped."""
WAIT = 60.0
"""How long any one condition may take to hold (seconds)."""
OPENED, STEP = "test-order-steps.opened", "test-order-steps.step"


def _ids(count: int, partitions: Iterable[int] = range(PARTITIONS), prefix: str = "o") -> list[str]:
    """``count`` order ids whose partitions are among ``partitions``."""
    wanted, i = set(partitions), 0
    ids: list[str] = []
    while len(ids) < count:
        candidate = f"{prefix}{i}"
        if partition_of(candidate, PARTITIONS) in wanted:
            ids.append(candidate)
        i += 1
    return ids


def _number(order_id: str) -> int:
    return int(order_id.lstrip("of"))


def _opened(ids: Sequence[str]) -> list[tuple[str, object]]:
    return [(o, OrderOpened(o, f"item-{_number(o) % 13}", _number(o) % 5 + 1)) for o in ids]


def _steps(ids: Sequence[str], step: int) -> list[tuple[str, object]]:
    """Step ``step`` (1 to STEPS) of each order: ``n`` from 1 to 10, varying with both."""
    return [(o, OrderStep(o, (_number(o) * 7 + step * 3) % 10 + 1)) for o in ids]


def _append(db: Database, events: Sequence[tuple[str, object]]) -> None:
    """Append ``events`` (source, message) to the saga's topic, 100 a transaction, each
    partitioned by its order id (the saga's correlation key)."""
    store = MessageStore(db)
    for start in range(0, len(events), 100):
        with db.transaction() as conn:
            for source, event in events[start : start + 100]:
                store.append(conn, TOPIC, source, [event])


def _model(db: Database) -> dict[str, tuple[str, int, str]]:
    """The sequential model: every message appended to the saga's topic, in position
    order, folded as the saga does; order id → (item, total, trail) of each order that
    ended."""
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(
            select(m.c.type, m.c.payload)
            .where(m.c.tenant == db.tenant, m.c.topic == TOPIC)
            .order_by(m.c.position)
        ).all()
    running: dict[str, list[Any]] = {}
    ended: dict[str, tuple[str, int, str]] = {}
    for type_name, payload in rows:
        body = json.loads(payload)
        order = body["order_id"]
        if type_name == OPENED:
            running.setdefault(order, [body["item"], body["qty"], 0, 0, ""])
            continue
        assert type_name == STEP, type_name
        state = running.get(order)
        if state is None or order in ended:
            continue
        state[2] += 1
        state[3] += state[1] * body["n"]
        state[4] += f"{body['n']}."
        if state[2] == STEPS:
            ended[order] = (state[0], state[3], state[4])
    return ended


def _done(db: Database) -> list[dict[str, Any]]:
    """The OrderDone commands the saga sent, in position order."""
    m = db.schema.messages
    with db.read() as conn:
        payloads = conn.execute(
            select(m.c.payload)
            .where(m.c.tenant == db.tenant, m.c.topic == DONE)
            .order_by(m.c.position)
        ).scalars()
        return [json.loads(p) for p in payloads]


def _done_count(db: Database) -> int:
    m = db.schema.messages
    with db.read() as conn:
        query = select(func.count()).where(m.c.tenant == db.tenant, m.c.topic == DONE)
        return int(conn.execute(query).scalar_one())


def _outcomes(db: Database) -> dict[str, tuple[str, int, str]]:
    """Order id → (item, total, trail) as the saga's OrderDone said; each order once."""
    done = _done(db)
    twice = [o for o, n in Counter(d["order_id"] for d in done).items() if n > 1]
    assert not twice, f"ended twice: {twice[:10]}"
    return {d["order_id"]: (d["item"], d["total"], d["trail"]) for d in done}


def _ended_by(db: Database) -> dict[str, str]:
    """Order id → the generation of the code that ended it."""
    return {d["order_id"]: d["by"] for d in _done(db)}


def _states(db: Database) -> dict[str, tuple[dict[str, Any], int, bool]]:
    """Saga instance → (stored state, state version, ended)."""
    s = db.schema.sagas
    with db.read() as conn:
        rows = conn.execute(
            select(s.c.saga_key, s.c.state, s.c.state_version, s.c.ended).where(
                s.c.tenant == db.tenant, s.c.saga == SAGA
            )
        ).all()
    return {key: (json.loads(state), int(sv), bool(ended)) for key, state, sv, ended in rows}


def _partitions(db: Database) -> list[PartitionRow]:
    with db.read() as conn:
        return Ownership(db).partitions(conn, [SAGA])


def _halted(db: Database) -> dict[int, PartitionRow]:
    return {p.partition: p for p in _partitions(db) if p.status == "halted"}


def _owner_names(db: Database) -> set[str]:
    return {str(name) for name, state in owners(db, SAGA).values() if state == "OWNED"}


def _rolling_deploy(
    db: Database,
    config: Path,
    logs: dict[str, Path],
    new_module: str,
    ids: Sequence[str],
    processes: list[Process],
) -> Process:
    """``old1`` (the first generation) opens every order of ``ids`` and applies its first
    step; then ``new1`` (``new_module``) starts, shares the partitions with ``old1`` and
    ``old1`` stops (SIGTERM, as a rolling deploy does), while the remaining steps are
    appended: before ``new1`` takes a share, while both run, while ``old1`` stops, and
    after it exited. Returns ``new1``, running. In quarters of ``ids``: Q0 and Q1 may end
    under either generation; Q2 and Q3 take their last step after ``old1`` exited."""
    old = start_instance(config, "old1", "orders_state_v1_app", log=logs["old1"])
    processes.append(old)
    wait_until(lambda: owned_by(db, {"old1"}, SAGA), timeout=WAIT, what="old1 holding it")
    _append(db, _opened(ids) + _steps(ids, 1))
    wait_until(
        lambda: lag(db, SAGA) == 0 and len(_states(db)) == len(ids),
        timeout=WAIT,
        what="old1 to open every order and apply its first step",
    )
    states = _states(db)
    assert {(s["steps"], v, e) for s, v, e in states.values()} == {(1, 1, False)}
    q = [ids[k::4] for k in range(4)]
    new = start_instance(config, "new1", new_module, log=logs["new1"])
    processes.append(new)
    _append(db, _steps(q[0], 2))
    wait_until(
        lambda: {"old1", "new1"} <= _owner_names(db), timeout=WAIT, what="both to hold a share"
    )
    _append(db, _steps(q[0], 3) + _steps(q[1], 2))
    old.send_signal(signal.SIGTERM)  # a rolling deploy stops the older instance
    _append(db, _steps(q[1], 3) + _steps(q[2], 2) + _steps(q[3], 2))
    assert old.wait(timeout=WAIT) == 0
    _append(db, _steps(q[2], 3) + _steps(q[3], 3))
    return new


@pytest.mark.parametrize(
    ("new_module", "by", "fields"),
    [
        (
            "orders_state_v2_app",
            "v2",
            {"item", "qty", "steps", "total", "trail", "steps_needed"},
        ),
        (
            "orders_state_v2_rename_app",
            "v2-rename",
            {"item", "quantity", "steps", "total", "trail"},
        ),
    ],
    ids=["added-field", "renamed-field"],
)
def test_a_rolling_deploy_of_a_versioned_state_change_ends_every_saga_once(
    db: Database, tmp_path: Path, new_module: str, by: str, fields: set[str]
) -> None:
    """v1 to ``new_module`` (state version 2 with its upcaster) mid-flight: every order
    ends once, as the model says, those the new code ended stored at state version 2."""
    config = cluster_config(tmp_path / "config.yaml", db)
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "new1")}
    ids = _ids(SAGAS)
    processes: list[Process] = []
    try:
        new = _rolling_deploy(db, config, logs, new_module, ids, processes)
        wait_until(lambda: _done_count(db) >= SAGAS, timeout=WAIT, what="every order to end")
        wait_until(lambda: lag(db, SAGA) == 0, timeout=WAIT, what="no lag")
        assert stop_instance(new) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                stop_instance(process)
    expected = _model(db)
    assert set(expected) == set(ids)  # the model: every order took its three steps
    outcomes = _outcomes(db)
    assert outcomes == expected  # none lost, none twice, each as the model says
    ended_by = _ended_by(db)
    assert set(ended_by.values()) <= {"v1", by}
    late = [o for k in (2, 3) for o in ids[k::4]]  # their last step came after old1 exited
    assert {ended_by[o] for o in late} == {by}
    states = _states(db)
    assert set(states) == set(ids) and all(ended for _, _, ended in states.values())
    for order, (state, state_version, _) in states.items():
        if ended_by[order] == by:  # read through the upcaster (a v1 state), stored at v2
            assert (set(state), state_version) == (fields, 2), (order, state)
        else:
            assert state_version == 1, (order, state)
    assert not _halted(db)
    assert all(p.error is None and p.status == "running" for p in _partitions(db))
    said = {name: log.read_text() for name, log in logs.items()}
    assert "halt" not in "".join(said.values()).lower(), said
    assert "needs a newer" not in said["new1"], said["new1"]
    print(
        f"\n{new_module}: {Counter(ended_by.values())}; old1 left "
        f"{said['old1'].count('is left to another instance')} partition(s) to new1"
    )


def test_a_state_change_without_a_state_version_halts_only_the_partitions_it_cannot_read(
    db: Database, tmp_path: Path
) -> None:
    """The older orders live in partitions 0-3 only; the new code opens others in 4-7
    after ``old1`` stopped. Partitions 0-3 halt at the first older state the new code
    meets, each naming it, the field and the fix; 4-7 go on. With the fix deployed and
    the partitions resumed, every order ends as the model says."""
    config = cluster_config(tmp_path / "config.yaml", db)
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "new1", "fix1")}
    old_partitions, fresh_partitions = {0, 1, 2, 3}, {4, 5, 6, 7}
    ids = _ids(SAGAS, old_partitions)
    fresh = _ids(FRESH, fresh_partitions, prefix="f")
    processes: list[Process] = []
    try:
        new = _rolling_deploy(db, config, logs, "orders_state_unversioned_app", ids, processes)
        # Orders opened by the new code only, in partitions without an older state.
        _append(db, _opened(fresh) + [e for s in range(1, STEPS + 1) for e in _steps(fresh, s)])
        wait_until(
            lambda: set(_halted(db)) == old_partitions and set(_ended_by(db)) >= set(fresh),
            timeout=WAIT,
            what="the partitions of older states to halt and the fresh orders to end",
        )
        halted = _halted(db)
        running = [p for p in _partitions(db) if p.partition not in halted]
        assert {p.partition for p in running} == fresh_partitions
        assert all(p.status == "running" and p.error is None for p in running)
        assert stop_instance(new) == 0

        # Stopped there, nothing applied: what the halted partitions hold is all still
        # there, their older states untouched.
        states = _states(db)
        ended_by = _ended_by(db)
        assert {ended_by[o] for o in fresh} == {"unversioned"}
        assert set(ended_by.values()) <= {"v1", "unversioned"}
        for order in ids:
            state, state_version, ended = states[order]
            assert state_version == 1 and "steps_needed" not in state, (order, state)
            assert ended == (order in ended_by), order
        for partition, row in halted.items():
            error = row.error or ""
            assert "\n" not in error, error
            assert error.startswith(f"sagas.UnreadableState: saga {SAGA!r} instance "), error
            key = error.split(" instance ", 1)[1].split("'")[1]
            assert key in ids and partition_of(key, PARTITIONS) == partition, (key, error)
            assert not states[key][2], key  # an instance in flight
            assert "steps_needed" in error, error  # the field
            assert f"state_version=2 and @state_upcaster({SAGA!r}, 1)" in error, error  # the fix
            assert row.halted_type == STEP
            print(f"\npartition {partition} halted: {error}")

        # The fix deployed (a state version and its upcaster), the partitions resumed:
        # every order ends as the model says.
        cli(config, "resume", SAGA, "--reason", "state upcaster deployed")
        processes.append(start_instance(config, "fix1", "orders_state_v2_app", log=logs["fix1"]))
        wait_until(
            lambda: _done_count(db) >= SAGAS + FRESH, timeout=WAIT, what="every order to end"
        )
        wait_until(lambda: lag(db, SAGA) == 0, timeout=WAIT, what="no lag")
        assert stop_instance(processes[-1]) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                stop_instance(process)
    expected = _model(db)
    assert set(expected) == {*ids, *fresh}
    assert _outcomes(db) == expected
    ended_by = _ended_by(db)
    assert set(ended_by.values()) <= {"v1", "unversioned", "v2"}
    assert {ended_by[o] for o in ids[2::4] + ids[3::4]} == {"v2"}
    assert not _halted(db)
    assert all(p.error is None for p in _partitions(db))
    said = {name: log.read_text() for name, log in logs.items()}
    assert "halt" not in (said["old1"] + said["fix1"]).lower(), said
    print(f"\nunversioned, then fixed: {Counter(ended_by.values())}")


def _waiting(db: Database) -> dict[int, str]:
    """Partition → why it waits for another instance, as ``projections status`` says."""
    report = consumers_report(db, ConsumerSettings())
    [entry] = [c for c in report["consumers"] if c["name"] == SAGA]
    return {p["partition"]: p["waiting"] for p in entry["partitions"] if "waiting" in p}


def test_an_older_instance_leaves_the_partitions_whose_states_newer_code_wrote(
    db: Database, tmp_path: Path
) -> None:
    """Mid-deploy, ``new1`` (state version 2) stops after it stored newer states in its
    share of the partitions (a restart, a deploy retried): ``old1`` takes every partition
    back, applies those of older states and leaves those holding newer ones: it never
    reads, skips or halts at one; they wait until ``new1`` is back, then every order ends
    as the model says."""
    config = cluster_config(tmp_path / "config.yaml", db)
    logs = {name: tmp_path / f"{name}.log" for name in ("old1", "new1", "new1-again")}
    ids = _ids(SAGAS)
    processes: list[Process] = []
    try:
        processes.append(start_instance(config, "old1", "orders_state_v1_app", log=logs["old1"]))
        wait_until(lambda: owned_by(db, {"old1"}, SAGA), timeout=WAIT, what="old1 holding it")
        _append(db, _opened(ids) + _steps(ids, 1))
        wait_until(
            lambda: lag(db, SAGA) == 0 and len(_states(db)) == SAGAS,
            timeout=WAIT,
            what="old1 to open every order and apply its first step",
        )
        new = start_instance(config, "new1", "orders_state_v2_app", log=logs["new1"])
        processes.append(new)
        wait_until(
            lambda: {"old1", "new1"} <= _owner_names(db), timeout=WAIT, what="both to hold a share"
        )
        _append(db, _steps(ids, 2))
        wait_until(lambda: lag(db, SAGA) == 0, timeout=WAIT, what="every second step applied")
        assert stop_instance(new) == 0
        before = _states(db)
        newer = {o for o, (_, version, _) in before.items() if version == 2}
        newer_partitions = {partition_of(o, PARTITIONS) for o in newer}
        assert newer and len(newer_partitions) < PARTITIONS
        assert all(s["steps"] == 2 for s, _, _ in before.values())
        older_only = [o for o in ids if partition_of(o, PARTITIONS) not in newer_partitions]

        _append(db, _steps(ids, 3))
        wait_until(
            lambda: set(_waiting(db)) == newer_partitions and set(_ended_by(db)) >= set(older_only),
            timeout=WAIT,
            what="old1 to apply the older states' partitions and leave the others",
        )
        reasons = set(_waiting(db).values())
        assert reasons == {f"needs a newer declaration of type 'saga-state:{SAGA}' version 2"}
        assert not _halted(db)
        assert not newer & set(_ended_by(db))  # no newer state read by the older code
        after = _states(db)
        assert {o: after[o] for o in newer} == {o: before[o] for o in newer}

        processes.append(
            start_instance(config, "new1", "orders_state_v2_app", log=logs["new1-again"])
        )
        wait_until(lambda: _done_count(db) >= SAGAS, timeout=WAIT, what="every order to end")
        wait_until(lambda: lag(db, SAGA) == 0, timeout=WAIT, what="no lag")
        left_waiting = _waiting(db)  # every partition is past what it waited for: none
        for process in (processes[0], processes[-1]):
            assert stop_instance(process) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                stop_instance(process)
    expected = _model(db)
    assert set(expected) == set(ids)
    assert _outcomes(db) == expected
    ended_by = _ended_by(db)
    assert {ended_by[o] for o in newer} == {"v2"}
    assert {ended_by[o] for o in older_only} == {"v1"}
    assert not _halted(db)
    said = {name: log.read_text() for name, log in logs.items()}
    assert "halt" not in "".join(said.values()).lower(), said
    stops = [line for line in said["old1"].splitlines() if "is left to another instance" in line]
    left = {int(line.split(" partition ", 1)[1].split()[0]) for line in stops}
    # Said in one line per newer state a minute (the partitions it left were read from the
    # rows above): at least one, naming a partition it left.
    assert stops and left <= newer_partitions, stops
    print(f"\nold1 left partitions {sorted(newer_partitions)}: {Counter(ended_by.values())}")
    # What a partition waited for has no effect once its checkpoint passed it: the status
    # must not say a partition owned and caught up by new1 still waits for a newer
    # declaration, and old1 said before which message it stopped.
    assert not left_waiting, f"still reported waiting once applied by new1: {left_waiting}"
    assert not [line for line in stops if "position None" in line], stops
