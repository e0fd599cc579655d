"""Settings classes, YAML config loading and the start-up validation rules."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging import _kinds as kinds
from messaging._config import load_settings, parse_duration, settings_from_mapping
from messaging._errors import ConfigError, RegistrationError
from messaging._settings import (
    ConflictRetrySettings,
    ConsumerGroupSettings,
    ConsumerOverride,
    ConsumerSettings,
    Distribution,
    ExecutorSettings,
    MessagingSettings,
    Settings,
    format_duration,
    validate,
)

FULL_EXAMPLE = """\
database: sqlite:///app.db          # default when absent: ./projections.db
tenant: default
messaging:
  consumer:
    rebalance-interval: 10s
    stale-instance-timeout: 30s
    graceful-shutdown-timeout: 20s
    heartbeat-interval: 5s
    batch-size: 500                  # messages fetched and committed at once
    idle-poll-interval: 200ms        # wait between empty fetches (no busy loop)
    executor: {max-workers: 8}
    conflict-retry: {max-retries: 5, max-delay: 1s}
projections:
  distribution: partitioned          # default for every projection
  consumers:
    ledger-totals: {distribution: single-owner, concurrency-limit: 1}
routing:
  distribution: partitioned
  consumers:
    audit: {distribution: single-owner}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "projections.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _config_error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(data)
    return str(info.value)


def _problem_lines(message: str) -> list[str]:
    header, *lines = message.splitlines()
    assert header == "invalid configuration:"
    return [line.strip() for line in lines]


# --- defaults and a full file ------------------------------------------------------------


def test_defaults_match_the_design() -> None:
    """Settings() carries every documented default, and an empty mapping gives the same."""
    s = Settings()
    c = s.messaging.consumer
    assert s.database == "sqlite:///projections.db"
    assert s.tenant == "default"
    assert s.table_prefix == "prj_"
    assert (c.rebalance_interval, c.stale_instance_timeout) == (10.0, 30.0)
    assert (c.graceful_shutdown_timeout, c.heartbeat_interval) == (20.0, 5.0)
    assert (c.batch_size, c.idle_poll_interval) == (500, 0.2)
    assert c.executor == ExecutorSettings(max_workers=8)
    assert c.conflict_retry == ConflictRetrySettings(max_retries=5, max_delay=1.0)
    for section in ("projections", "routing", "sagas"):
        assert s.group(section) == ConsumerGroupSettings(
            distribution=Distribution.PARTITIONED, consumers={}
        )
    assert settings_from_mapping({}) == s
    validate(s)


def test_settings_are_frozen_and_keyword_only() -> None:
    """Settings cannot be mutated and refuse positional arguments."""
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Settings().tenant = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ExecutorSettings(4)  # type: ignore[call-arg]  # keyword-only: the call must fail


def test_design_example_file_loads(tmp_path: Path) -> None:
    """The full YAML example loads to exactly the values it spells out."""
    settings = load_settings(_write(tmp_path, FULL_EXAMPLE), environ={})
    assert settings == Settings(
        database="sqlite:///app.db",
        tenant="default",
        messaging=MessagingSettings(
            consumer=ConsumerSettings(
                rebalance_interval=10.0,
                stale_instance_timeout=30.0,
                graceful_shutdown_timeout=20.0,
                heartbeat_interval=5.0,
                batch_size=500,
                idle_poll_interval=0.2,
                executor=ExecutorSettings(max_workers=8),
                conflict_retry=ConflictRetrySettings(max_retries=5, max_delay=1.0),
            )
        ),
        consumer_groups={
            "projections": ConsumerGroupSettings(
                distribution=Distribution.PARTITIONED,
                consumers={
                    "ledger-totals": ConsumerOverride(
                        distribution=Distribution.SINGLE_OWNER, concurrency_limit=1
                    )
                },
            ),
            "routing": ConsumerGroupSettings(
                consumers={"audit": ConsumerOverride(distribution=Distribution.SINGLE_OWNER)}
            ),
        },
    )


def test_non_default_values_are_read(tmp_path: Path) -> None:
    """Values that differ from the defaults reach the settings, in every section."""
    path = _write(
        tmp_path,
        """\
        tenant: acme
        table-prefix: acme_
        messaging:
          consumer:
            rebalance-interval: 2s
            stale-instance-timeout: 1m
            batch-size: 50
            executor: {max-workers: 2}
        sagas:
          distribution: single-owner
        """,
    )
    s = load_settings(path, environ={})
    assert (s.tenant, s.table_prefix) == ("acme", "acme_")
    assert s.messaging.consumer.rebalance_interval == 2.0
    assert s.messaging.consumer.stale_instance_timeout == 60.0
    assert s.messaging.consumer.batch_size == 50
    assert s.messaging.consumer.executor.max_workers == 2
    assert s.group("sagas").distribution is Distribution.SINGLE_OWNER


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    """An empty (or comment-only) file means all defaults."""
    assert load_settings(_write(tmp_path, "# nothing here\n"), environ={}) == Settings()


def test_no_file_gives_defaults() -> None:
    """Without a path nothing is read and the defaults apply."""
    assert load_settings(environ={}) == Settings()


# --- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("0s", 0.0),
        ("200ms", 0.2),
        (".5s", 0.5),
        ("0.1m", 6.0),
        ("  30s ", 30.0),
        ("5 s", 5.0),
        ("1234ms", 1.234),
        ("10", 10.0),
        ("1.5", 1.5),
        (" 2.5 ", 2.5),
    ],
)
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    """Durations with a unit of ms, s, m or h parse to float seconds; a plain number is
    seconds (as the CLI, the HTTP API and ``wait_for`` take it)."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "s", "-5s", "-5", "+5s", "fast", "10 sec", "10S", "1e3s", "5us", "1.s", "10s5", "nan"],
)
def test_parse_duration_rejects(text: str) -> None:
    """Signs, unknown units and other text are not durations."""
    with pytest.raises(ValueError, match=r"expected a duration like 10s or 500ms, got '"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.5, "500ms"),
        (10.0, "10s"),
        (0.2, "200ms"),
        (1.5, "1.5s"),
        (90.0, "90s"),
        (120.0, "2m"),
        (7200.0, "2h"),
        (0.0, "0s"),
        (0.0005, "0.5ms"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    """Durations are written with the largest unit that keeps the value exact."""
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**12))
def test_format_then_parse_round_trips_whole_milliseconds(milliseconds: int) -> None:
    """parse_duration(format_duration(x)) == x for any whole number of milliseconds."""
    seconds = milliseconds / 1000
    assert parse_duration(format_duration(seconds)) == seconds


# --- structuring errors ------------------------------------------------------------------


def test_unknown_top_level_key_is_rejected() -> None:
    """An unknown key at the top level is named and placed at the top level."""
    lines = _problem_lines(_config_error({"databse": "sqlite://"}))
    assert lines == ["unknown key 'databse' @ (top level)"]


def test_unknown_nested_key_is_reported_with_full_path() -> None:
    """A misspelt nested key is reported with the full path of its mapping."""
    data = {"messaging": {"consumer": {"rebalance-intervall": "10s"}}}
    lines = _problem_lines(_config_error(data))
    assert lines == ["unknown key 'rebalance-intervall' @ messaging.consumer"]


def test_unknown_key_in_consumer_override_is_rejected() -> None:
    """Keys inside a per-consumer override are checked too, under the consumer's name."""
    data = {"projections": {"consumers": {"ledger-totals": {"concurency-limit": 1}}}}
    lines = _problem_lines(_config_error(data))
    assert lines == ["unknown key 'concurency-limit' @ projections.consumers.ledger-totals"]


def test_snake_case_keys_are_unknown() -> None:
    """Only kebab-case keys are accepted; the Python field name is not an alias."""
    lines = _problem_lines(_config_error({"table_prefix": "x_"}))
    assert lines == ["unknown key 'table_prefix' @ (top level)"]


def test_bad_duration_names_the_key() -> None:
    """A value that is not a duration is reported at its full path."""
    lines = _problem_lines(
        _config_error({"messaging": {"consumer": {"rebalance-interval": "fast"}}})
    )
    assert lines == [
        "expected a duration like 10s or 500ms, got 'fast' @ messaging.consumer.rebalance-interval"
    ]


def test_a_yaml_number_is_seconds_and_a_negative_one_is_refused() -> None:
    """A YAML number is seconds, as a plain number is everywhere; a negative one, or a
    boolean, is no duration."""
    settings = settings_from_mapping({"messaging": {"consumer": {"heartbeat-interval": 2}}})
    assert settings.messaging.consumer.heartbeat_interval == 2.0
    lines = _problem_lines(_config_error({"messaging": {"consumer": {"heartbeat-interval": -5}}}))
    assert lines == [
        "expected a duration like 10s or 500ms, got -5 @ messaging.consumer.heartbeat-interval"
    ]
    lines = _problem_lines(_config_error({"messaging": {"consumer": {"heartbeat-interval": True}}}))
    assert lines == [
        "expected a duration like 10s or 500ms, got true @ messaging.consumer.heartbeat-interval"
    ]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"projections": {"distribution": "round-robin"}},
            "invalid value 'round-robin', expected one of partitioned, single-owner"
            " @ projections.distribution",
        ),
        (
            {"routing": {"consumers": {"audit": {"distribution": "single_owner"}}}},
            "invalid value 'single_owner', expected one of partitioned, single-owner"
            " @ routing.consumers.audit.distribution",
        ),
    ],
)
def test_bad_distribution_lists_the_choices(data: dict[str, Any], line: str) -> None:
    """An unknown distribution mode is reported with the accepted values."""
    assert _problem_lines(_config_error(data)) == [line]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"messaging": {"consumer": {"batch-size": "500"}}},
            "expected a whole number, got string '500' @ messaging.consumer.batch-size",
        ),
        (
            {"messaging": {"consumer": {"batch-size": 1.5}}},
            "expected a whole number, got 1.5 @ messaging.consumer.batch-size",
        ),
        (
            {"messaging": {"consumer": {"executor": {"max-workers": True}}}},
            "expected a whole number, got true @ messaging.consumer.executor.max-workers",
        ),
        (
            {"messaging": {"consumer": ["batch-size", 500]}},
            "expected a mapping, got a list @ messaging.consumer",
        ),
        ({"messaging": None}, "expected a mapping, got null @ messaging"),
        (
            {"projections": {"consumers": ["ledger-totals"]}},
            "expected a mapping, got a list @ projections.consumers",
        ),
        ({"tenant": 42}, "expected a string, got 42 @ tenant"),
    ],
)
def test_wrong_type_is_reported_clearly(data: dict[str, Any], line: str) -> None:
    """A value of the wrong type gives one line naming what was expected and where."""
    assert _problem_lines(_config_error(data)) == [line]


def test_top_level_must_be_a_mapping() -> None:
    """A list at the top level is refused."""
    lines = _problem_lines(_config_error(["tenant", "default"]))
    assert lines == ["expected a mapping, got a list @ (top level)"]


def test_all_structuring_errors_are_reported_together() -> None:
    """Every problem in the file is listed, one per line, not just the first."""
    data = {
        "tenant": "t",
        "bogus": 1,
        "messaging": {
            "consumer": {
                "batch-size": "many",
                "idle-poll-interval": "soon",
                "conflict-retry": {"max-delay": "1 sec", "max-tries": 3},
            }
        },
        "sagas": {"distribution": "everywhere"},
    }
    lines = _problem_lines(_config_error(data))
    assert sorted(lines) == sorted(
        [
            "unknown key 'bogus' @ (top level)",
            "expected a whole number, got string 'many' @ messaging.consumer.batch-size",
            "expected a duration like 10s or 500ms, got 'soon'"
            " @ messaging.consumer.idle-poll-interval",
            "expected a duration like 10s or 500ms, got '1 sec'"
            " @ messaging.consumer.conflict-retry.max-delay",
            "unknown key 'max-tries' @ messaging.consumer.conflict-retry",
            "invalid value 'everywhere', expected one of partitioned, single-owner"
            " @ sagas.distribution",
        ]
    )


# --- validation rules --------------------------------------------------------------------


def _with_consumer(**changes: Any) -> Settings:
    consumer = attrs.evolve(ConsumerSettings(), **changes)
    return Settings(messaging=MessagingSettings(consumer=consumer))


def _with_retry(**changes: Any) -> Settings:
    return _with_consumer(conflict_retry=ConflictRetrySettings(**changes))


def _with_override(group: str, limit: int) -> Settings:
    overrides = ConsumerGroupSettings(consumers={"x": ConsumerOverride(concurrency_limit=limit)})
    return Settings(consumer_groups={group: overrides})


@pytest.mark.parametrize(
    ("build", "expected", "count"),
    [
        pytest.param(
            lambda: _with_consumer(rebalance_interval=30.0),
            "messaging.consumer.rebalance-interval (30s) must be below "
            "messaging.consumer.stale-instance-timeout (30s)",
            1,
            id="rebalance-below-stale",
        ),
        pytest.param(
            lambda: _with_consumer(heartbeat_interval=15.0),
            "messaging.consumer.heartbeat-interval (15s) must be below half of "
            "messaging.consumer.stale-instance-timeout (30s)",
            1,
            id="heartbeat-below-half-stale",
        ),
        pytest.param(
            lambda: _with_consumer(
                stale_instance_timeout=0.5,
                rebalance_interval=0.1,
                heartbeat_interval=0.1,
                conflict_retry=ConflictRetrySettings(max_delay=0.1),
            ),
            "messaging.consumer.stale-instance-timeout (500ms) must be 1s or more",
            1,
            id="stale-at-least-1s",
        ),
        pytest.param(
            lambda: _with_retry(max_retries=0, max_delay=30.0),
            "messaging.consumer.conflict-retry.max-delay (30s) must be below "
            "messaging.consumer.stale-instance-timeout (30s)",
            1,
            id="max-delay-below-stale",
        ),
        pytest.param(
            lambda: _with_retry(max_retries=20, max_delay=1.0),
            "messaging.consumer.conflict-retry.max-retries (20) * "
            "messaging.consumer.conflict-retry.max-delay (1s) = 20s must be below "
            "messaging.consumer.graceful-shutdown-timeout (20s)",
            1,
            id="retries-times-delay-below-graceful",
        ),
        pytest.param(
            lambda: _with_consumer(rebalance_interval=0.0),
            "messaging.consumer.rebalance-interval (0s) must be above 0s",
            1,
            id="rebalance-positive",
        ),
        pytest.param(
            lambda: _with_consumer(stale_instance_timeout=-1.0),
            "messaging.consumer.stale-instance-timeout (-1s) must be above 0s",
            None,
            id="stale-positive",
        ),
        pytest.param(
            lambda: _with_consumer(graceful_shutdown_timeout=0.0),
            "messaging.consumer.graceful-shutdown-timeout (0s) must be above 0s",
            2,  # the retry budget no longer fits either
            id="graceful-positive",
        ),
        pytest.param(
            lambda: _with_consumer(heartbeat_interval=0.0),
            "messaging.consumer.heartbeat-interval (0s) must be above 0s",
            1,
            id="heartbeat-positive",
        ),
        pytest.param(
            lambda: _with_consumer(idle_poll_interval=0.0),
            "messaging.consumer.idle-poll-interval (0s) must be above 0s",
            1,
            id="idle-poll-positive",
        ),
        pytest.param(
            lambda: _with_retry(max_delay=0.0),
            "messaging.consumer.conflict-retry.max-delay (0s) must be above 0s",
            1,
            id="max-delay-positive",
        ),
        pytest.param(
            lambda: _with_consumer(batch_size=0),
            "messaging.consumer.batch-size (0) must be 1 or more",
            1,
            id="batch-size",
        ),
        pytest.param(
            lambda: _with_consumer(executor=ExecutorSettings(max_workers=0)),
            "messaging.consumer.executor.max-workers (0) must be 1 or more",
            1,
            id="max-workers",
        ),
        pytest.param(
            lambda: _with_retry(max_retries=-1),
            "messaging.consumer.conflict-retry.max-retries (-1) must be 0 or more",
            1,
            id="max-retries",
        ),
        pytest.param(
            lambda: _with_override("projections", 0),
            "projections.consumers.x.concurrency-limit (0) must be 1 or more",
            1,
            id="concurrency-limit-projections",
        ),
        pytest.param(
            lambda: _with_override("routing", -3),
            "routing.consumers.x.concurrency-limit (-3) is not supported: route consumers "
            "have no concurrency limit",
            1,
            id="concurrency-limit-routing",
        ),
        pytest.param(
            lambda: _with_override("sagas", 0),
            "sagas.consumers.x.concurrency-limit (0) is not supported: a saga is applied in "
            "one lane per instance",
            1,
            id="concurrency-limit-sagas",
        ),
        pytest.param(
            lambda: Settings(
                consumer_groups={"projections": ConsumerGroupSettings(retired_versions=-1)}
            ),
            "projections.retired-versions (-1) must be 0 or more",
            1,
            id="retired-versions",
        ),
        pytest.param(
            lambda: Settings(
                consumer_groups={
                    "projections": ConsumerGroupSettings(
                        consumers={"x": ConsumerOverride(retired_versions=-2)}
                    )
                }
            ),
            "projections.consumers.x.retired-versions (-2) must be 0 or more",
            1,
            id="retired-versions-override",
        ),
        pytest.param(
            lambda: Settings(
                consumer_groups={
                    "routing": ConsumerGroupSettings(
                        consumers={"x": ConsumerOverride(batch_size=0)}
                    )
                }
            ),
            "routing.consumers.x.batch-size (0) must be 1 or more",
            1,
            id="batch-size-override",
        ),
        pytest.param(lambda: Settings(tenant=""), "tenant must not be empty", 1, id="tenant"),
        pytest.param(
            lambda: Settings(tenant="  "), "tenant must not be empty", 1, id="tenant-blank"
        ),
        pytest.param(lambda: Settings(database=""), "database must not be empty", 1, id="database"),
        pytest.param(
            lambda: Settings(table_prefix="1prj_"), "table-prefix ('1prj_')", 1, id="prefix-digit"
        ),
        pytest.param(
            lambda: Settings(table_prefix="prj-"), "table-prefix ('prj-')", 1, id="prefix-dash"
        ),
        pytest.param(lambda: Settings(table_prefix=""), "table-prefix ('')", 1, id="prefix-empty"),
        pytest.param(
            lambda: Settings(table_prefix="p" * 22), "table-prefix ('ppp", 1, id="prefix-long"
        ),
        pytest.param(
            lambda: Settings(table_prefix="prj_\n"), "table-prefix ('prj_\\n')", 1, id="prefix-nl"
        ),
    ],
)
def test_each_validation_rule(
    build: Callable[[], Settings], expected: str, count: int | None
) -> None:
    """Breaking one rule raises ConfigError, as the Settings are built in code, with a line
    naming the setting's YAML path."""
    with pytest.raises(ConfigError) as info:
        build()
    lines = _problem_lines(str(info.value))
    assert any(expected in line for line in lines), lines
    if count is not None:
        assert len(lines) == count, lines


@pytest.mark.parametrize("prefix", ["_", "prj_", "A1_b2", "p" * 21])
def test_valid_table_prefixes_pass(prefix: str) -> None:
    """A letter or underscore followed by up to 20 word characters is a valid prefix."""
    validate(Settings(table_prefix=prefix))


def test_boundary_values_pass() -> None:
    """Values just inside every rule are accepted."""
    validate(
        _with_consumer(
            stale_instance_timeout=1.0,
            rebalance_interval=0.999,
            heartbeat_interval=0.499,
            graceful_shutdown_timeout=1.0,
            conflict_retry=ConflictRetrySettings(max_retries=0, max_delay=0.999),
        )
    )


def test_all_validation_errors_are_reported_together() -> None:
    """Every broken rule is listed, one per line, in a single ConfigError."""
    data = {
        "tenant": "",
        "messaging": {
            "consumer": {"rebalance-interval": "30s", "batch-size": 0, "heartbeat-interval": "20s"}
        },
    }
    lines = _problem_lines(_config_error(data))
    assert len(lines) == 4, lines
    assert [line.split(" ", 1)[0] for line in lines] == [
        "messaging.consumer.rebalance-interval",
        "messaging.consumer.heartbeat-interval",
        "messaging.consumer.batch-size",
        "tenant",
    ]


def test_validation_runs_when_loading_a_file(tmp_path: Path) -> None:
    """load_settings applies the rules and names the file in the error."""
    path = _write(tmp_path, "messaging:\n  consumer:\n    heartbeat-interval: 15s\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: invalid configuration:")
    assert "messaging.consumer.heartbeat-interval (15s) must be below half" in message


# --- files and the database URL ----------------------------------------------------------


@pytest.fixture
def file_with_database(tmp_path: Path) -> Path:
    return _write(tmp_path, "database: sqlite:///from-file.db\n")


def test_database_argument_wins(file_with_database: Path) -> None:
    """The --database argument beats the environment and the file."""
    env = {"PROJECTIONS_DATABASE_URL": "sqlite:///from-env.db"}
    s = load_settings(file_with_database, database="sqlite:///from-arg.db", environ=env)
    assert s.database == "sqlite:///from-arg.db"


def test_environment_beats_file(file_with_database: Path) -> None:
    """PROJECTIONS_DATABASE_URL beats the file's database key."""
    env = {"PROJECTIONS_DATABASE_URL": "sqlite:///from-env.db"}
    assert load_settings(file_with_database, environ=env).database == "sqlite:///from-env.db"


def test_environment_beats_default() -> None:
    """PROJECTIONS_DATABASE_URL applies when there is no file at all."""
    env = {"PROJECTIONS_DATABASE_URL": "sqlite:///from-env.db"}
    assert load_settings(environ=env).database == "sqlite:///from-env.db"


def test_file_beats_default(file_with_database: Path) -> None:
    """The file's database key beats the default; an empty variable counts as unset."""
    assert load_settings(file_with_database, environ={}).database == "sqlite:///from-file.db"
    env = {"PROJECTIONS_DATABASE_URL": ""}
    assert load_settings(file_with_database, environ=env).database == "sqlite:///from-file.db"


def test_default_database_when_nothing_given(tmp_path: Path) -> None:
    """Without argument, variable or key the database is ./projections.db."""
    s = load_settings(_write(tmp_path, "tenant: t\n"), environ={})
    assert s.database == "sqlite:///projections.db"


def test_environ_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit environ the process environment is read."""
    monkeypatch.setenv("PROJECTIONS_DATABASE_URL", "sqlite:///from-os.db")
    assert load_settings().database == "sqlite:///from-os.db"


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    """A config path that does not exist is an error naming it."""
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_settings(path, environ={})
    assert str(path) in str(info.value)


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    """Broken YAML is reported with the file, line and column."""
    path = _write(tmp_path, "tenant: t\ndatabase: sqlite://\nmessaging: a: b\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: invalid YAML")
    assert "line 3, column 13" in message


def test_file_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    """A YAML file holding a list or a scalar is refused."""
    for text in ("- tenant\n- default\n", "just text\n"):
        with pytest.raises(ConfigError, match="top level must be a mapping"):
            load_settings(_write(tmp_path, text), environ={})


# --- per-consumer overrides --------------------------------------------------------------


def test_distribution_for_uses_override_then_group_default() -> None:
    """distribution_for returns a consumer's own mode, else the group's."""
    group = ConsumerGroupSettings(
        distribution=Distribution.SINGLE_OWNER,
        consumers={
            "audit": ConsumerOverride(distribution=Distribution.PARTITIONED),
            "limited": ConsumerOverride(concurrency_limit=2),
        },
    )
    assert group.distribution_for("audit") is Distribution.PARTITIONED
    assert group.distribution_for("limited") is Distribution.SINGLE_OWNER
    assert group.distribution_for("unknown") is Distribution.SINGLE_OWNER


def test_concurrency_limit_for_returns_override_or_none() -> None:
    """concurrency_limit_for returns a consumer's limit, or None when it has none."""
    group = ConsumerGroupSettings(
        consumers={
            "audit": ConsumerOverride(distribution=Distribution.SINGLE_OWNER),
            "limited": ConsumerOverride(concurrency_limit=2),
        },
    )
    assert group.concurrency_limit_for("limited") == 2
    assert group.concurrency_limit_for("audit") is None
    assert group.concurrency_limit_for("unknown") is None


def test_overrides_from_the_design_example(tmp_path: Path) -> None:
    """The example file's overrides are visible through the lookup methods."""
    s = load_settings(_write(tmp_path, FULL_EXAMPLE), environ={})
    projections, routing = s.group("projections"), s.group("routing")
    assert projections.distribution_for("ledger-totals") is Distribution.SINGLE_OWNER
    assert projections.concurrency_limit_for("ledger-totals") == 1
    assert projections.distribution_for("other") is Distribution.PARTITIONED
    assert routing.distribution_for("audit") is Distribution.SINGLE_OWNER
    assert routing.concurrency_limit_for("audit") is None
    assert s.group("sagas").distribution_for("anything") is Distribution.PARTITIONED


def test_plugins_are_a_list_of_module_names() -> None:
    """`plugins` loads extra modules; anything but a list of names is refused at its key."""
    assert settings_from_mapping({"plugins": ["a.b", "c"]}).plugins == ("a.b", "c")
    for bad in ("a.b", [1], [""], {"a": 1}):
        with pytest.raises(ConfigError, match=r"expected a list of names.* @ plugins"):
            settings_from_mapping({"plugins": bad})


def test_the_admin_token_comes_from_the_environment_first(tmp_path: Path) -> None:
    """PROJECTIONS_ADMIN_TOKEN beats admin.token; an empty variable counts as unset; the
    token never shows in a repr."""
    path = _write(tmp_path, "admin:\n  token: from-the-file-0123456789\n")
    assert load_settings(path, environ={}).admin.token == "from-the-file-0123456789"
    env = {"PROJECTIONS_ADMIN_TOKEN": "from-the-environment-0123"}
    settings = load_settings(path, environ=env)
    assert settings.admin.token == "from-the-environment-0123"
    assert "from-the-environment" not in repr(settings)
    assert load_settings(path, environ={"PROJECTIONS_ADMIN_TOKEN": ""}).admin.token == (
        "from-the-file-0123456789"
    )
    assert load_settings(environ={}).admin.token is None


def test_bad_admin_settings_name_their_key_and_never_the_token(tmp_path: Path) -> None:
    cases = [
        ({"token": "short-secret"}, "admin.token must be at least 16 characters long"),
        ({"token": "has spaces inside it"}, "admin.token must be printable ASCII without spaces"),
        (
            {"token": 1234567890123456789},
            "expected a string, got 1234567890123456789 @ admin.token",
        ),
        ({"allowed-hosts": ["https://proxy/"]}, "admin.allowed-hosts.0 ('https://proxy/') must be"),
        ({"allowed-hosts": "proxy"}, "expected a list of names, got string 'proxy' @ admin"),
        ({"tokens": "x"}, "unknown key 'tokens' @ admin"),
    ]
    for admin, message in cases:
        with pytest.raises(ConfigError) as error:
            settings_from_mapping({"admin": admin})
        assert message in str(error.value)
        assert "secret" not in str(error.value) and "spaces inside" not in str(error.value)
    with pytest.raises(ConfigError, match=r"(?s)^\$PROJECTIONS_ADMIN_TOKEN: .*at least 16"):
        load_settings(environ={"PROJECTIONS_ADMIN_TOKEN": "weak"})
    assert settings_from_mapping(
        {"admin": {"allowed-hosts": ["admin.example.com", "proxy:8443", "[::1]:9000"]}}
    ).admin.allowed_hosts == ("admin.example.com", "proxy:8443", "[::1]:9000")


# --- the sections of the consumer kinds --------------------------------------------------


@pytest.fixture
def auditors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A consumer kind of the test's own, registered for the test only."""
    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
    kinds.register_kind(
        kinds.ConsumerKind(
            value="auditor",
            article="an auditor",
            settings_group="audits",
            no_concurrency_limit="auditors run in one lane",
        )
    )
    yield


def test_a_kind_brings_its_section_to_the_file(auditors: None) -> None:
    """A registered kind's section is a top-level key, checked like the built-in ones."""
    s = settings_from_mapping({"audits": {"distribution": "single-owner"}})
    assert s.group("audits").distribution is Distribution.SINGLE_OWNER
    assert s.consumer_groups == {"audits": s.group("audits")}
    assert _problem_lines(_config_error({"audits": {"distribution": "one"}})) == [
        "invalid value 'one', expected one of partitioned, single-owner @ audits.distribution"
    ]
    limited = {"audits": {"consumers": {"x": {"concurrency-limit": 2}}}}
    assert _problem_lines(_config_error(limited)) == [
        "audits.consumers.x.concurrency-limit (2) is not supported: auditors run in one lane"
    ]
    parking = {"audits": {"consumers": {"x": {"on-failure": "park-source"}}}}
    assert _problem_lines(_config_error(parking)) == [
        "audits.consumers.x.on-failure (park-source) is not supported: audits halt their "
        "partition on a failure"
    ]


def test_a_section_no_kind_registered_is_unknown() -> None:
    """Without its kind a section is an unknown key in a file, and refused in code."""
    assert _problem_lines(_config_error({"audits": {}})) == ["unknown key 'audits' @ (top level)"]
    with pytest.raises(ConfigError) as info:
        Settings(consumer_groups={"projection": ConsumerGroupSettings()})
    assert _problem_lines(str(info.value)) == [
        "projection: no consumer kind is configured under this section "
        "(sections: projections, routing, sagas)"
    ]


@pytest.mark.parametrize(
    ("section", "error"),
    [("audit_log", "must be a lower-case word"), ("tenant", "are names of settings")],
)
def test_a_kind_section_must_be_a_free_top_level_key(
    monkeypatch: pytest.MonkeyPatch, section: str, error: str
) -> None:
    """A section that could not be a key of its own in the file is refused."""
    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
    with pytest.raises(RegistrationError, match=error):
        kinds.register_kind(kinds.ConsumerKind(value="k", article="a k", settings_group=section))
        settings_from_mapping({})


def test_retired_versions_are_read_per_projection_with_the_group_default() -> None:
    settings = settings_from_mapping(
        {"projections": {"retired-versions": 2, "consumers": {"a": {"retired-versions": 0}}}}
    )
    group = settings.group("projections")
    assert (group.retired_versions_for("a"), group.retired_versions_for("b")) == (0, 2)
    assert settings_from_mapping({}).group("projections").retired_versions_for("a") == 1


@pytest.mark.parametrize("section", ["projections", "routing", "sagas"])
def test_every_kind_takes_a_batch_size_per_consumer(section: str) -> None:
    settings = settings_from_mapping(
        {
            "messaging": {"consumer": {"batch-size": 200}},
            section: {"consumers": {"slow": {"batch-size": 5}}},
        }
    )
    shared, group = settings.messaging.consumer, settings.group(section)
    assert group.consumer_settings_for("slow", shared) == attrs.evolve(shared, batch_size=5)
    assert group.consumer_settings_for("other", shared) is shared
