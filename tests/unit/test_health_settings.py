"""The ``health`` section of the config: its default, loading, and the rules tying the
stall timeout to the timing settings; the severities the verdicts map to."""

from __future__ import annotations

import pytest

from messaging._config import settings_from_mapping
from messaging._errors import ConfigError
from messaging._states import Severity, Verdict


def test_the_stall_timeout_defaults_to_30s_and_loads_from_the_file() -> None:
    assert settings_from_mapping({}).health.stall_timeout == 30.0
    loaded = settings_from_mapping({"health": {"stall-timeout": "6500ms"}})
    assert loaded.health.stall_timeout == 6.5


def test_an_unknown_health_key_is_refused_with_its_path() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'stall' @ \$?\.?health"):
        settings_from_mapping({"health": {"stall": "1s"}})


def test_a_stall_timeout_of_nothing_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"health.stall-timeout \(0s\) must be above 0s"):
        settings_from_mapping({"health": {"stall-timeout": "0s"}})


def test_a_long_idle_poll_interval_is_no_contradiction() -> None:
    """New messages wake the workers at once: the idle poll is only a fallback."""
    settings = settings_from_mapping({"messaging": {"consumer": {"idle-poll-interval": "1h"}}})
    assert settings.health.stall_timeout == 30.0


def test_a_stall_timeout_within_the_retries_of_a_batch_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"health": {"stall-timeout": "5s"}})  # 5 retries * 1s
    message = str(info.value)
    assert "health.stall-timeout (5s) must be above" in message
    assert "messaging.consumer.conflict-retry.max-retries (5)" in message
    assert "messaging.consumer.conflict-retry.max-delay (1s) = 5s" in message


def test_verdicts_map_to_severities_and_exit_codes() -> None:
    healthy = {Verdict.CAUGHT_UP, Verdict.LAGGING, Verdict.PAUSED, Verdict.REBUILDING}
    assert {v for v in Verdict if v.severity is Severity.HEALTHY} == healthy
    assert Verdict.STALLED.severity is Severity.DEGRADED
    assert {v for v in Verdict if v.severity is Severity.CRITICAL} == {
        Verdict.HALTED,
        Verdict.UNOWNED,
    }
    assert [s.exit_code for s in Severity] == [0, 1, 2]
