"""The OpenTelemetry plugin on a real in-process instance (SQLite), with in-memory exporters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import deadline_app
import pytest
from clusters import wait_until
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_trace_id

import projections_otel
from messaging import (
    ConsumerGroupSettings,
    Database,
    Instance,
    MessageStore,
    OnFailure,
    Settings,
    collect_consumers,
    create_plugin_manager,
    handler,
    hookimpl,
    load_settings,
    message,
)
from messaging._config import settings_from_mapping
from messaging.applying._worker import ConsumerWorker
from messaging.store._clock import ManualClock
from messaging.store._rows import partition_of
from projections import projection
from projections._operations import rebuild
from projections._reports import consumers_report
from projections.examples.ledger import TOPIC, Balances, traffic
from projections.testing import SimulatedCluster, simulation_settings
from projections_otel import Telemetry, context_of, trace_headers

CONSUMER = "ledger-balances"


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def telemetry(reader: InMemoryMetricReader, tracer_provider: TracerProvider) -> Iterator[Telemetry]:
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(meter_provider=meter_provider, tracer_provider=tracer_provider)
    meter_provider.shutdown()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/telemetry.db")
    database.prepare()
    yield database
    database.dispose()


def _append(db: Database, count: int) -> list[int]:
    """Append about ``count`` ledger messages; return their positions."""
    store = MessageStore(db)
    positions: list[int] = []
    for command in traffic(seed=7, count=count, accounts=20):
        with db.transaction() as conn:
            for source, message in command:
                positions += store.append(conn, TOPIC, source, [message])
    return positions


def _wait_applied(db: Database, settings: Settings, timeout: float = 30.0) -> None:
    """Until every partition of the ledger projection has no lag (or fail after timeout)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        report = consumers_report(db, settings.messaging.consumer)
        last = next((c for c in report["consumers"] if c["name"] == CONSUMER), None)
        if last and last["partitions"] and all(p["lag"] == 0 for p in last["partitions"]):
            return
        time.sleep(0.05)
    pytest.fail(f"{CONSUMER} not caught up after {timeout}s: {last}")


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Data points by metric name."""
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def _of(points: list[Any], **attributes: Any) -> list[Any]:
    return [p for p in points if all(p.attributes.get(k) == v for k, v in attributes.items())]


def test_an_instance_reports_metrics_and_batch_spans(
    db: Database,
    telemetry: Telemetry,
    reader: InMemoryMetricReader,
    exporter: InMemorySpanExporter,
) -> None:
    settings = Settings()
    manager = create_plugin_manager(
        ["projections.examples.ledger"], plugins=[telemetry], load_entrypoints=False
    )
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="otel-1")
    instance.start()
    try:
        positions = _append(db, 300)
        _wait_applied(db, settings)
    finally:
        instance.stop()
    appended, last_position = len(positions), max(positions)

    points = _points(reader)
    assert {
        "projections.messages.applied",
        "projections.batch.duration",
        "projections.checkpoint.position",
        "projections.partition.claims",
        "projections.partition.releases",
        "projections.heartbeat.duration",
        "projections.rebalance.duration",
        "projections.membership.read.duration",
        "projections.members.live",
        "projections.partition.lag",
    } <= set(points)
    (members,) = points["projections.members.live"]
    assert members.value == 1
    lags = _of(points["projections.partition.lag"], consumer=CONSUMER, instance="otel-1")
    assert sorted(p.attributes["partition"] for p in lags) == list(range(8))

    applied = _of(points["projections.messages.applied"], consumer=CONSUMER)
    assert applied, points["projections.messages.applied"]
    assert {dict(p.attributes)["instance"] for p in applied} == {"otel-1"}
    assert sum(p.value for p in applied) == appended

    durations = _of(points["projections.batch.duration"], consumer=CONSUMER, instance="otel-1")
    assert len(durations) == 1 and durations[0].count >= 1 and durations[0].sum >= 0

    (position,) = _of(points["projections.checkpoint.position"], consumer=CONSUMER)
    assert position.value == last_position

    claims = _of(points["projections.partition.claims"], consumer=CONSUMER, instance="otel-1")
    assert sorted(p.attributes["partition"] for p in claims) == list(range(8))
    assert all(p.value == 1 for p in claims)
    releases = _of(points["projections.partition.releases"], consumer=CONSUMER)
    assert sorted(p.attributes["partition"] for p in releases) == list(range(8))

    spans = [s for s in exporter.get_finished_spans() if s.name == "projections.batch"]
    everything: list[tuple[Any, dict[str, Any]]] = [(s, dict(s.attributes or {})) for s in spans]
    ours = [(s, a) for s, a in everything if a["consumer"] == CONSUMER]
    assert ours
    assert sum(a["count"] for _, a in ours) == appended
    assert max(a["last_position"] for _, a in ours) == last_position
    for span, attributes in ours:
        assert attributes["instance"] == "otel-1"
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= span.end_time
        assert set(attributes["partitions"]) <= set(range(8))
    assert len(applied) == 1 and len(ours) == sum(d.count for d in durations)


def test_trace_context_travels_from_appender_to_handler(
    db: Database, tracer_provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("test")
    store = MessageStore(db)
    ((source, message),) = next(traffic(seed=1, count=1))
    with tracer.start_as_current_span("append") as appending:
        headers = trace_headers()
        with db.transaction() as conn:
            (position,) = store.append(conn, TOPIC, source, [message], headers=headers)
    assert set(headers) >= {"traceparent"}
    trace_id = appending.get_span_context().trace_id
    assert format_trace_id(trace_id) in headers["traceparent"]

    with db.read() as conn:
        envelope = MessageStore(db).envelopes(conn, [position])[position]
    context = context_of(envelope)
    with tracer.start_as_current_span("handle", context=context) as handling:
        pass
    assert handling.get_span_context().trace_id == trace_id
    (finished,) = [s for s in exporter.get_finished_spans() if s.name == "handle"]
    assert finished.parent is not None
    assert finished.parent.span_id == appending.get_span_context().span_id

    # Without trace headers: an empty context, so a new trace.
    assert trace_headers() == {}
    with tracer.start_as_current_span("orphan", context=context_of({})) as orphan:
        pass
    assert orphan.get_span_context().trace_id != trace_id


def test_the_plugin_loads_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "app.yaml"
    config.write_text(f"database: sqlite:///{tmp_path}/app.db\nplugins: [projections_otel]\n")
    settings = load_settings(str(config))
    assert list(settings.plugins) == ["projections_otel"]
    manager = create_plugin_manager(
        ["projections.examples.ledger", *settings.plugins], load_entrypoints=False
    )
    assert manager.is_registered(projections_otel)
    implemented = {
        hook.name
        for hook in manager.get_hookcallers(projections_otel) or []
        if hook.get_hookimpls()
    }
    assert implemented == {
        "projections_admin_started",
        "projections_metrics_exposition",
        "projections_ownership",
        "projections_batch_read",
        "projections_instance_started",
        "projections_instance_stopping",
        "projections_partition_claimed",
        "projections_partition_released",
        "projections_batch_applied",
        "projections_message_failed",
        "projections_partition_halted",
        "projections_source_parked",
        "projections_source_retried",
        "projections_retrying",
        "projections_lock_contention",
        "projections_deadlines_delivered",
        "projections_heartbeat",
        "projections_rebalanced",
        "projections_lag",
        "projections_versions",
    }
    # Every implementation matches a specification (the manager checked them on creation).
    manager.check_pending()
    assert collect_consumers(manager)


def test_hooks_never_raise(telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(telemetry.retries, "add", broken)
    telemetry.projections_retrying(what="apply x", instance_id="i", error=TimeoutError())


def test_durations_land_in_sub_second_buckets(
    telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """A batch of 0.02 s is counted in the bucket (0.01, 0.025], not in the SDK's default
    first bucket (0, 5] with every other sub-second time: each duration histogram advises
    the plugin's boundaries, 1 ms to 30 s."""
    telemetry.projections_batch_applied(
        consumer="c",
        partitions=[0],
        epochs={0: 1},
        instance_id="i",
        count=1,
        last_position=1,
        seconds=0.02,
    )
    telemetry.projections_heartbeat(instance_id="i", seconds=0.003)
    telemetry.projections_rebalanced(
        instance_id="i", seconds=0.04, membership_seconds=0.002, live_members=1
    )
    telemetry.projections_deadlines_delivered(
        consumer="c", instance_id="i", count=1, lateness=[0.15]
    )
    points = _points(reader)
    [batch] = points["projections.batch.duration"]
    bucket = list(batch.bucket_counts).index(1)
    assert tuple(batch.explicit_bounds[bucket - 1 : bucket + 1]) == (0.01, 0.025)
    histograms = [
        "projections.heartbeat.duration",
        "projections.rebalance.duration",
        "projections.membership.read.duration",
        "projections.deadline.lateness",
    ]
    for name in histograms:
        [point] = points[name]
        assert tuple(point.explicit_bounds) == projections_otel.DURATION_BUCKETS, name


def _contended_instance(
    tmp_path: Path, telemetry: Telemetry
) -> tuple[Database, Instance, ConsumerWorker]:
    """An instance driven by hand (no loops) on a SQLite file whose busy timeout is 50 ms."""
    db = Database(f"sqlite:///{tmp_path}/contended.db?timeout=0.05")
    db.prepare()
    settings = settings_from_mapping(
        {"messaging": {"consumer": {"conflict-retry": {"max-retries": 10}}}}
    )
    manager = create_plugin_manager(
        ["projections.examples.ledger"], plugins=[telemetry], load_entrypoints=False
    )
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="contended")
    instance.start(loops=False)
    return db, instance, instance.workers[CONSUMER]


def test_a_batch_meeting_another_writers_lock_is_retried_and_counted(
    tmp_path: Path, telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """While another connection holds SQLite's write lock, the batch's commit meets it, is
    retried, and counted as lock contention; once the lock is let go the batch commits."""
    db, instance, worker = _contended_instance(tmp_path, telemetry)
    try:
        appended = len(_append(db, 40))
        outcome: list[int | BaseException] = []

        def poll() -> None:
            try:
                outcome.append(worker.poll())
            except BaseException as exc:  # reported by the assertion below
                outcome.append(exc)

        other = Database(db.url)
        with other.transaction():  # BEGIN IMMEDIATE: the second writer holds the lock
            thread = threading.Thread(target=poll)
            thread.start()
            wait_until(
                lambda: _points(reader).get("projections.lock.contentions"),
                timeout=10,
                what="the batch to meet the lock",
            )
        thread.join(timeout=30)
        other.dispose()
        assert outcome == [appended]
    finally:
        instance.stop()
        db.dispose()
    (contention,) = _points(reader)["projections.lock.contentions"]
    assert dict(contention.attributes) == {
        "what": f"apply {CONSUMER}",
        "kind": "busy",
        "instance": "contended",
        "tenant": "default",
    }
    assert contention.value >= 1
    (retries,) = _points(reader)["projections.retries"]
    assert dict(retries.attributes) == {
        "what": f"apply {CONSUMER}",
        "error.type": "OperationalError",
        "instance": "contended",
        "tenant": "default",
    }
    assert retries.value == contention.value


@message("test.otel.fragile")
@attrs.define(frozen=True)
class FragileNoted:
    text: str


@projection("otel-fragile", topics="fragile", partitions=2)
class Fragile:
    @handler
    def noted(self, event: FragileNoted) -> None:
        if event.text == "poison":
            raise ValueError("cannot handle poison")


class _FragileApp:
    @hookimpl
    def projections_consumers(self) -> list[type]:
        return [Fragile]


def _poison_points(
    db: Database, telemetry: Telemetry, reader: InMemoryMetricReader, settings: Settings
) -> tuple[dict[str, list[Any]], dict[str, object]]:
    """An instance applies a poison message: the data points, and the attributes a
    failure's should have (but ``error.type``)."""
    manager = create_plugin_manager([], plugins=[telemetry, _FragileApp()], load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="fragile-1")
    instance.start(loops=False)
    try:
        with db.transaction() as conn:
            MessageStore(db).append(conn, "fragile", "s1", [FragileNoted("poison")])
        instance.workers["otel-fragile"].poll()
    finally:
        instance.stop()
    expected = {
        "consumer": "otel-fragile",
        "partition": partition_of("s1", 2),
        "type": "test.otel.fragile",
        "instance": "fragile-1",
        "tenant": "default",
    }
    points = _points(reader)
    (failure,) = points["projections.message.failures"]
    assert dict(failure.attributes) == {**expected, "error.type": "ValueError"}
    return points, expected


def test_failures_and_halts_name_the_instance(
    db: Database, telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """A poison message counts as a failure and a halt of its partition, on its instance."""
    points, expected = _poison_points(db, telemetry, reader, Settings())
    (halt,) = points["projections.partition.halts"]
    assert dict(halt.attributes) == expected


def test_a_parked_source_counts_as_a_failure_and_a_park(
    db: Database, telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """With ``on-failure: park-source`` the poison message parks its source instead of
    halting the partition: a failure and a park are counted, no halt."""
    parking = {"projections": ConsumerGroupSettings(on_failure=OnFailure.PARK_SOURCE)}
    points, expected = _poison_points(db, telemetry, reader, Settings(consumer_groups=parking))
    (park,) = points["projections.source.parks"]
    assert dict(park.attributes) == expected and park.value == 1
    assert "projections.partition.halts" not in points


def test_delivered_deadlines_are_counted_with_their_lateness(
    tmp_path: Path, telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """Each committed deadline delivery adds to the counter and records its lateness."""
    db = Database(f"sqlite:///{tmp_path}/deadlines.db", clock=ManualClock())
    db.prepare()
    cluster = SimulatedCluster(
        db,
        [deadline_app.Timers],
        settings_from_mapping({"messaging": {"consumer": {"batch-size": 10}}}),
        plugins=[telemetry],
    )
    cluster.join("timekeeper")
    due = cluster.clock.value + 1
    with db.transaction() as conn:
        for i in range(3):
            MessageStore(db).append(conn, "timers", f"t{i}", [deadline_app.TimerSet(f"t{i}", due)])
    cluster.poll_all()
    cluster.clock.advance(1.5)
    cluster.poll_all()

    points = _points(reader)
    (delivered,) = points["projections.deadlines.delivered"]
    assert delivered.value == 3
    assert dict(delivered.attributes) == {
        "consumer": "test-timers",
        "instance": "timekeeper",
        "tenant": "default",
    }
    (lateness,) = points["projections.deadline.lateness"]
    assert lateness.count == 3
    assert lateness.sum == pytest.approx(1.5, abs=1e-3)  # each poll takes a microsecond
    db.dispose()


def test_a_partition_claimed_from_another_instance_counts_as_a_move(
    tmp_path: Path, telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """First claims are not moves; the partitions a joiner takes over are."""
    db = Database(f"sqlite:///{tmp_path}/moves.db", clock=ManualClock())
    db.prepare()
    cluster = SimulatedCluster(db, [Balances], settings_from_mapping({}), plugins=[telemetry])
    cluster.join("first")
    cluster.join("second")
    for _ in range(4):
        cluster.tick()
    moved = sum(1 for owner in cluster.owners().values() if owner == "second")
    assert moved == 4  # half of the ledger's 8 partitions

    points = _points(reader)
    moves = {dict(p.attributes)["instance"]: 0 for p in points["projections.partition.moves"]}
    for point in points["projections.partition.moves"]:
        moves[dict(point.attributes)["instance"]] += point.value
    assert moves == {"second": moved}
    claims = sum(p.value for p in points["projections.partition.claims"])
    assert claims == 8 + moved
    db.dispose()


def test_a_rebuild_reports_the_live_and_the_building_version(
    tmp_path: Path, telemetry: Telemetry, reader: InMemoryMetricReader
) -> None:
    """While a version is built the gauges say which; its partitions' lag is reported
    under ``name@N``; after the cutover the live version is the new one, building 0."""
    clocked = Database(f"sqlite:///{tmp_path}/versions.db", clock=ManualClock())
    clocked.prepare()
    cluster = SimulatedCluster(clocked, [Balances], simulation_settings(), plugins=[telemetry])
    try:
        cluster.join("v-1")
        _append(clocked, 100)
        cluster.settle()
        rebuild(clocked, CONSUMER, who="test")
        cluster.tick()  # starts version 2
        cluster.tick()  # claims its partitions, reports the round
        points = _points(reader)
        (live,) = _of(points["projections.version.live"], consumer=CONSUMER)
        (building,) = _of(points["projections.version.building"], consumer=CONSUMER)
        assert (live.value, building.value) == (1, 2)
        lags = _of(points["projections.partition.lag"], consumer=f"{CONSUMER}@2")
        assert sorted(p.attributes["partition"] for p in lags) == list(range(8))
        cluster.settle()  # builds it and cuts over
        cluster.tick()
        points = _points(reader)
        (live,) = _of(points["projections.version.live"], consumer=CONSUMER)
        (building,) = _of(points["projections.version.building"], consumer=CONSUMER)
        assert (live.value, building.value) == (2, 0)
    finally:
        clocked.dispose()
