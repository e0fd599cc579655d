"""A release moves the generation for the instance that waits for it only: a join among
many instances then costs one round of each, not one per release (the pulse of
:mod:`messaging.distribution._pulse` tells releases from every other change)."""

from __future__ import annotations

import fault_app
from sqlalchemy import select

from messaging import Database, Instance, Settings, create_plugin_manager
from messaging._consumers import consumer_spec
from messaging.distribution._pulse import CHANGE, RELEASE, bump_generation, only_releases

SEQUENCE = consumer_spec(fault_app.Sequence)  # 4 partitions


def _instance(db: Database, name: str) -> Instance:
    hooks = create_plugin_manager([], load_entrypoints=False).hook
    instance = Instance(db, [SEQUENCE], Settings(), hooks, name=name)
    instance.start(loops=False)  # registered, declared, its first round run
    return instance


def _bump(db: Database, *, release: bool) -> None:
    with db.transaction() as conn:
        bump_generation(db, conn, release=release)


def _generation(db: Database) -> int:
    g = db.schema.generations
    with db.read() as conn:
        return int(conn.execute(select(g.c.generation).where(g.c.tenant == db.tenant)).scalar_one())


def test_releases_and_other_changes_count_apart() -> None:
    assert only_releases(7, 7 + RELEASE) and only_releases(7, 7 + 3 * RELEASE)
    assert not only_releases(7, 7 + CHANGE) and not only_releases(7, 7 + RELEASE + CHANGE)
    assert not only_releases(None, RELEASE)  # no round read yet: always a round
    carried = (RELEASE - 1) + CHANGE  # the changes' half wrapped into the releases'
    assert not only_releases(RELEASE - 1, carried)


def test_a_release_wakes_the_instance_that_waits_for_it_and_no_other(db: Database) -> None:
    first = _instance(db, "first")
    try:
        assert first.workers[SEQUENCE.name].claims().keys() == {0, 1, 2, 3}
        assert not first.pulser.beat()  # nothing since its round
        before = _generation(db)
        _bump(db, release=True)  # a peer's release: it waits for nothing
        assert _generation(db) == before + RELEASE
        assert not first.pulser.beat()
        _bump(db, release=False)  # anything else: a round
        assert _generation(db) == before + RELEASE + CHANGE
        assert first.pulser.beat()
        first.rebalance()

        second = _instance(db, "second")  # its round: half assigned to it, held by first
        try:
            assert second.rebalancer.awaiting() and not first.rebalancer.awaiting()
            assert first.pulser.beat()  # the join is a change: first plans again
            first.rebalance()  # and releases half to second
            assert len(first.workers[SEQUENCE.name].claims()) == 2
            assert not first.pulser.beat()  # its own release: nothing for it
            assert second.pulser.beat()  # second waits for those partitions
            second.rebalance()
            assert len(second.workers[SEQUENCE.name].claims()) == 2
            assert not second.rebalancer.awaiting()
            _bump(db, release=True)
            assert not second.pulser.beat() and not first.pulser.beat()
        finally:
            second.stop()
    finally:
        first.stop()
