"""Tenants sharing one database, attacked as a hostile co-tenant would: same account ids,
same message ids, same saga keys, a rebuild, a poison message, a table named like the
other tenant's. Each tenant's read model stays equal to its own sequential replay and the
other's rows stay byte-for-byte what they were."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from clusters import cli, lag, seed_ledger, start_instance, stop_instance, wait_until, write_config
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)

from messaging import Database, HandlerContext, NewMessage, RegistrationError, handler, message
from messaging._consumers import collect_specs
from messaging._messages import registry
from messaging._states import PartitionStatus
from messaging.distribution._ownership import Ownership
from messaging.store._clock import ManualClock
from messaging.store._fastpath import sends_directly
from messaging.store._migrations import migrate
from messaging.store._tenancy import physical_name
from messaging.versions._declarations import tenant_fingerprint
from projections import projection
from projections._operations import audit_log, pause, rebuild, resume
from projections.examples import ledger, transfers
from projections.testing import SimulatedCluster, simulation_settings
from projections.testing.database import drop_tables

BALANCES = "ledger-balances"

metadata = MetaData()
clash = Table("clash", metadata, Column("id", Integer, primary_key=True))
acme_clash = Table("acme__clash", metadata, Column("id", Integer, primary_key=True))
notes = Table(
    "tenant_notes",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("text", String(50), nullable=False),
)


@message("test.tenants.noted")
@attrs.define(frozen=True)
class Noted:
    text: str


@projection("clash", topics="clash", partitions=1, tables=[clash])
class Clash:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        ctx.execute(insert(clash), {})


@projection("acme-clash", topics="clash", partitions=1, tables=[acme_clash])
class AcmeClash:
    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        ctx.execute(insert(acme_clash), {})


@projection("text-notes", topics="notes", partitions=1, tables=[notes])
class TextNotes:
    """Writes its read model with SQL text, which a renamed tenant cannot have."""

    @handler
    def noted(self, event: Noted, ctx: HandlerContext) -> None:
        ctx.connection.execute(
            text("INSERT INTO tenant_notes (position, text) VALUES (:p, :t)"),
            {"p": ctx.position, "t": event.text},
        )


Tenants = Callable[..., Database]


@pytest.fixture
def tenants(database_url: str, table_prefix: str) -> Iterator[Tenants]:
    """Databases of one URL and table prefix for the tenants a test names (prepared,
    migrated on MySQL, with a manual clock unless ``clock=False``); every table of the
    prefix and every tenant's copy of the read models used here dropped afterwards."""
    made: list[Database] = []
    declared = [
        ledger.balances,
        transfers.notifications,
        clash,
        acme_clash,
        notes,
    ]

    def names() -> list[str]:  # every tenant's copy a test here may make
        tenants = ("default", "acme", "Acme", "north", "south")
        return [physical_name(tenant, t.name) for tenant in tenants for t in declared]

    def make(tenant: str, *, clock: bool = True) -> Database:
        db = Database(
            database_url,
            tenant=tenant,
            table_prefix=table_prefix,
            clock=ManualClock() if clock else None,
        )
        if not made and not db.is_sqlite:
            drop_tables(db, names())  # what an interrupted run may have left
            migrate(db)
        made.append(db)
        db.prepare()
        return db

    yield make
    if made and not made[0].is_sqlite:
        drop_tables(made[0], names())
    for db in made:
        db.dispose()


def _rows(db: Database, table: Table) -> list[tuple[Any, ...]]:
    """Every row of the tenant's copy of ``table``, as the driver returns it, in key order."""
    physical = db.read_model(table)
    with db.read() as conn:
        query = select(physical).order_by(*physical.primary_key.columns)
        return [tuple(row) for row in conn.execute(query)]


def _balances(db: Database) -> dict[str, tuple[str, int, int]]:
    with db.read() as conn:
        rows = conn.execute(select(db.read_model(ledger.balances))).mappings().all()
    return ledger.read_model(rows)


def _replay(cluster: SimulatedCluster) -> dict[str, tuple[str, int, int]]:
    return ledger.replay(m for _, m in cluster.appended)


def _append(cluster: SimulatedCluster, command: list[tuple[str, object]]) -> None:
    with cluster.db.transaction() as conn:
        for source, event in command:
            cluster.store.append(conn, ledger.TOPIC, source, [event])
            cluster.appended.append((ledger.TOPIC, event))


def _halted(db: Database, consumer: str) -> list[Any]:
    with db.read() as conn:
        return [
            r
            for r in Ownership(db).partitions(conn, [consumer])
            if r.status == PartitionStatus.HALTED
        ]


@pytest.mark.parametrize("pair", [("default", "acme"), ("north", "south")])
def test_two_ledger_tenants_keep_their_own_read_models_through_rebuild_and_poison(
    tenants: Tenants, pair: tuple[str, str]
) -> None:
    """Interleaved traffic on the same account ids; a rebuild in one tenant and a poison
    message in the other leave the other's rows byte-for-byte as they were, and each
    tenant's read model equals the replay of its own messages."""
    first, second = (
        SimulatedCluster(tenants(name), [ledger.Balances], simulation_settings()) for name in pair
    )
    for cluster in (first, second):
        cluster.join("a")
    one = list(ledger.traffic(1, 300, accounts=12))
    two = list(ledger.traffic(2, 300, accounts=12))  # the same account ids, other amounts
    for index, (a, b) in enumerate(zip(one, two, strict=False)):
        _append(first, a)
        _append(second, b)
        if index % 40 == 0:
            first.poll_all()
            second.poll_all()
    first.settle()
    second.settle()
    assert _balances(first.db) == _replay(first) and _replay(first)
    assert _balances(second.db) == _replay(second) != _replay(first)
    with first.db.read() as conn:
        tables = set(inspect(conn).get_table_names())
    assert {physical_name(pair[0], "ledger_balances"), f"{pair[1]}__ledger_balances"} <= tables

    # A rebuild in the second tenant: the first's rows do not move, and it keeps running.
    before = _rows(first.db, ledger.balances)
    rebuild(second.db, BALANCES, who="attacker", reason="empty the neighbour")
    second.tick()  # the instance picks the rebuild up: drops and recreates its tables
    assert _rows(first.db, ledger.balances) == before
    for account in sorted(_replay(first))[:5]:
        _append(first, [(account, ledger.Deposited(account, 11))])
    first.settle()
    second.settle()
    assert _balances(second.db) == _replay(second)
    assert _balances(first.db) == _replay(first)

    # A poison message in the first tenant halts its partition; the second is untouched.
    before = _rows(second.db, ledger.balances)
    account = next(source for source, event in one[0])
    with first.db.transaction() as conn:
        first.store.append_encoded(
            conn,
            [NewMessage(topic=ledger.TOPIC, source=account, type="ledger.deposited", payload="{}")],
        )
    _append(first, [(account, ledger.Deposited(account, 7))])  # waits behind the poison
    first.settle()
    assert [r.halted_type for r in _halted(first.db, BALANCES)] == ["ledger.deposited"]
    assert _halted(second.db, BALANCES) == []
    assert _rows(second.db, ledger.balances) == before
    resume(first.db, BALANCES, who="operator", skip_poison=True)
    first.settle()
    second.settle()
    assert _balances(first.db) == _replay(first)
    assert _rows(second.db, ledger.balances) == before
    assert _balances(second.db) == _replay(second)


def test_a_pause_in_one_tenant_leaves_the_other_applying(tenants: Tenants) -> None:
    """Tenant acme pauses the consumer both tenants run under the same name: the default
    tenant keeps applying its own traffic, acme's rows and checkpoints stand still until
    it resumes, and the default tenant's audit has no entry of acme's pause."""
    first, second = (
        SimulatedCluster(tenants(name), [ledger.Balances], simulation_settings())
        for name in ("default", "acme")
    )
    for cluster in (first, second):
        cluster.join("a")
        for command in ledger.traffic(6, 40, accounts=5):
            _append(cluster, command)
        cluster.settle()
    pause(second.db, BALANCES, who="attacker", reason="stop the neighbour")
    second.tick()
    held = _rows(second.db, ledger.balances)
    for command in ledger.traffic(7, 40, accounts=5):
        _append(first, command)
        _append(second, command)
    first.settle()
    second.settle()
    assert (_state(first.db), lag(first.db)) == ("running", 0)
    assert _balances(first.db) == _replay(first)
    assert _state(second.db) == "paused" and (lag(second.db) or 0) > 0
    assert _rows(second.db, ledger.balances) == held
    assert [e["command"] for e in audit_log(first.db, BALANCES)] == []
    resume(second.db, BALANCES, who="operator")
    second.settle()
    assert _balances(second.db) == _replay(second) and lag(second.db) == 0


def test_a_tenant_connection_keeps_the_direct_statement_path(tenants: Tenants) -> None:
    """The translation does not switch off sending planned statements to the driver."""
    db = tenants("acme")
    db.read_model(ledger.balances)
    with db.transaction() as conn:
        assert sends_directly(conn)


@pytest.mark.multiprocess
def test_two_projection_processes_differing_only_in_tenant(
    tenants: Tenants, tmp_path: Path
) -> None:
    """Two ``projections run`` processes, one per tenant; ``projections rebuild`` of one
    tenant empties and replays only its own read model."""
    north, south = tenants("north", clock=False), tenants("south", clock=False)
    configs = {
        db.tenant: write_config(tmp_path / f"{db.tenant}.yaml", db, extra=f"tenant: {db.tenant}\n")
        for db in (north, south)
    }
    seed_ledger(north, 1500, seed=3)
    seed_ledger(south, 1500, seed=4)
    processes = [start_instance(configs[db.tenant], f"run-{db.tenant}") for db in (north, south)]
    try:
        for db in (north, south):

            def caught_up(db: Database = db) -> bool:
                return lag(db) == 0

            wait_until(caught_up, timeout=90, what=f"{db.tenant} to catch up")
        expected = {db.tenant: _expected_balances(db) for db in (north, south)}
        assert _balances(north) == expected["north"] != expected["south"] == _balances(south)
        before = _rows(north, ledger.balances)

        cli(configs["south"], "rebuild", BALANCES, "--reason", "test")
        wait_until(
            lambda: _state(south) == "running" and lag(south) == 0 and _balances(south),
            timeout=90,
            what="south to rebuild and catch up",
        )
        assert _balances(south) == expected["south"]
        assert _rows(north, ledger.balances) == before
        assert _state(north) == "running" and lag(north) == 0
    finally:
        for process in processes:
            assert stop_instance(process) == 0


def _expected_balances(db: Database) -> dict[str, tuple[str, int, int]]:
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(
            select(m.c.type, m.c.payload).where(m.c.tenant == db.tenant).order_by(m.c.position)
        ).all()
    return ledger.replay(registry.decode(t, p) for t, p in rows)


def _state(db: Database) -> str | None:
    t = db.schema.consumers
    with db.read() as conn:
        return conn.execute(
            select(t.c.state).where(t.c.tenant == db.tenant, t.c.name == BALANCES)
        ).scalar_one_or_none()


def _count(db: Database, table: Table, **where: str) -> int:
    with db.read() as conn:
        query = select(func.count()).where(
            table.c.tenant == db.tenant, *(table.c[k] == v for k, v in where.items())
        )
        return int(conn.execute(query).scalar_one())


def _sagas(db: Database) -> tuple[int, int]:
    """(saga instances, ended ones) of the tenant's transfer saga."""
    t = db.schema.sagas
    with db.read() as conn:
        total, ended = conn.execute(
            select(func.count(), func.sum(t.c.ended.cast(Integer))).where(
                t.c.tenant == db.tenant, t.c.saga == "ledger-transfers"
            )
        ).one()
    return int(total), int(ended or 0)


def _processed_ids(db: Database) -> set[tuple[str, str]]:
    p = db.schema.processed
    with db.read() as conn:
        return {
            (consumer, message_id)
            for consumer, message_id in conn.execute(
                select(p.c.consumer, p.c.message_id).where(p.c.tenant == db.tenant)
            )
        }


def test_saga_and_route_consumers_of_two_tenants_keep_their_own_ids_state_and_deadlines(
    tenants: Tenants,
) -> None:
    """Both tenants get the very same transfer traffic, so the same saga keys, deadline
    names and (for sends caused at the same positions) message ids. While only the first
    runs, the second's sagas, deadlines and handled ids stay its own (none ended, none
    delivered, none recorded); then the second ends with the same balances and
    notifications, having handled the ids the first handled too."""
    consumers = [
        ledger.Balances,
        transfers.TransferSaga,
        transfers.Accounts,
        transfers.Notifications,
    ]
    first, second = (
        SimulatedCluster(tenants(name), consumers, simulation_settings())
        for name in ("default", "acme")
    )
    traffic = list(transfers.traffic(seed=9, count=25, accounts=6))
    for cluster in (first, second):
        cluster.join("a")
        for command in traffic:
            with cluster.db.transaction() as conn:
                for topic, source, event in command:
                    cluster.store.append(conn, topic, source, [event])
                    cluster.appended.append((topic, event))
    events = [event for command in traffic for _, _, event in command]

    # The second tenant's saga starts its sagas and schedules their deadlines, and no
    # more runs there: its clock stands, its route consumers have handled nothing.
    second.running["a"].workers["ledger-transfers"].poll()
    pending = _count(second.db, second.db.schema.deadlines, saga="ledger-transfers")
    assert pending > 0
    for _ in range(6):  # the first tenant's time passes its deadlines many times over
        first.tick(transfers.TRANSFER_TIMEOUT)
        first.settle()
    assert _balances(first.db) == transfers.model(events)
    assert _count(first.db, first.db.schema.deadlines, saga="ledger-transfers") == 0
    assert _count(second.db, second.db.schema.deadlines, saga="ledger-transfers") == pending
    assert _processed_ids(second.db) == set()
    assert _rows(second.db, transfers.notifications) == []
    requested = sum(isinstance(event, transfers.TransferRequested) for event in events)
    assert _sagas(first.db) == (requested, requested)  # every one started and ended
    started, ended = _sagas(second.db)
    assert 0 < started < requested and ended == 0  # its own: one batch, nothing ended
    first_rows = _rows(first.db, transfers.notifications)

    for _ in range(6):
        second.tick(transfers.TRANSFER_TIMEOUT)
        second.settle()
    assert _balances(second.db) == transfers.model(events)
    # Sends caused by the same positions have the same derived ids in both tenants: each
    # tenant handled them (a guard shared across tenants would have skipped them).
    handled = _processed_ids(first.db), _processed_ids(second.db)
    assert len(handled[0]) == len(handled[1]) and handled[0] & handled[1]
    assert _rows(second.db, transfers.notifications) == first_rows
    assert _rows(first.db, transfers.notifications) == first_rows
    assert _count(second.db, second.db.schema.deadlines, saga="ledger-transfers") == 0


def test_a_declared_table_named_like_a_tenants_copy_is_refused(tenants: Tenants) -> None:
    """The default tenant's ``acme__clash`` is what tenant acme's ``clash`` is called, in
    whatever table prefix acme runs: ``__`` is refused in declared names at start."""
    default = SimulatedCluster(tenants("default"), [AcmeClash], simulation_settings())
    with pytest.raises(RegistrationError) as refused:
        default.join("a")
    error = str(refused.value)
    assert "'acme__clash'" in error and "reserved" in error and "\n" not in error
    assert default.running == {}


def test_tenants_differing_in_letter_case_are_refused_one_table(tenants: Tenants) -> None:
    """Tenants ``acme`` and ``Acme`` would share ``acme__clash`` where names are compared
    case-insensitively (SQLite, MySQL on some systems): the second is refused at start,
    naming the table and both tenants, and the first's rows are untouched."""
    first = SimulatedCluster(tenants("acme"), [Clash], simulation_settings())
    first.join("a")
    first.append("clash", "s", [Noted("x")])
    first.settle()
    before = _rows(first.db, clash)
    assert len(before) == 1

    intruder = SimulatedCluster(tenants("Acme"), [Clash], simulation_settings())
    with pytest.raises(RegistrationError) as refused:
        intruder.join("b")
    error = str(refused.value)
    assert "Acme__clash" in error and "'acme'" in error and "'Acme'" in error
    assert "\n" not in error
    assert _rows(first.db, clash) == before
    assert intruder.running == {}


def test_sql_text_in_a_renamed_tenants_handler_halts_it_naming_the_statement(
    tenants: Tenants,
) -> None:
    """SQL text cannot be given the tenant's tables: rather than write the default
    tenant's table, the batch fails and its partition halts with the statement named.
    The default tenant, whose tables keep their names, may use it."""
    for name in ("default", "acme"):
        cluster = SimulatedCluster(tenants(name), [TextNotes], simulation_settings())
        cluster.join("a")
        cluster.append("notes", "s", [Noted(name)])
        cluster.settle()
        halted = _halted(cluster.db, "text-notes")
        if name == "default":
            assert halted == [] and _rows(cluster.db, notes) == [(1, "default")]
        else:
            assert len(halted) == 1
            assert "INSERT INTO tenant_notes" in halted[0].error
            assert "'acme'" in halted[0].error and "declared Table" in halted[0].error
            assert _rows(cluster.db, notes) == []
    default = Database(cluster.db.url, table_prefix=cluster.db.schema.prefix)
    try:
        assert _rows(default, notes) == [(1, "default")]  # nothing of acme's went there
    finally:
        default.dispose()


def test_upgrading_keeps_the_default_tenants_tables_and_rebuilds_a_renamed_tenants(
    tenants: Tenants,
) -> None:
    """A deployment from before per-tenant tables recorded the fingerprint of the declared
    tables: the default tenant's is unchanged (nothing rebuilt), another tenant's differs,
    so its first start rebuilds the projection into its own new table from its messages."""
    spec = collect_specs([ledger.Balances])[0]
    default, acme = tenants("default"), tenants("acme")
    assert tenant_fingerprint(default, spec) == spec.fingerprint()
    assert tenant_fingerprint(acme, spec) != spec.fingerprint()

    cluster = SimulatedCluster(acme, [ledger.Balances], simulation_settings())
    cluster.join("a")
    for command in ledger.traffic(5, 60, accounts=6):
        _append(cluster, command)
    cluster.settle()
    cluster.stop("a")
    consumers = acme.schema.consumers
    with acme.transaction() as conn:  # as the previous version left it: no copy, old print
        conn.execute(
            update(consumers)
            .where(consumers.c.tenant == "acme", consumers.c.name == BALANCES)
            .values(fingerprint=spec.fingerprint())
        )
        acme.read_model(ledger.balances).drop(conn)
    cluster.join("b")
    assert _state(acme) == "running"
    cluster.settle()
    assert _balances(acme) == _replay(cluster) != {}
