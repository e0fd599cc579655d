"""``apply-timeout``: a group default and per-consumer overrides, five minutes unless set,
refused at start (naming both settings) when it would not outlast a lock wait; a
deadline fails the batch's message with the reason and the position."""

from __future__ import annotations

import pytest

import projections  # noqa: F401  (registers the kinds and their sections)
from messaging import ApplyTimedOut, ConfigError
from messaging._config import settings_from_mapping
from messaging.applying._apply_timeout import NO_DEADLINE, Deadline


def test_the_consumer_wins_over_its_section_whose_default_is_five_minutes() -> None:
    settings = settings_from_mapping(
        {"projections": {"apply-timeout": "90s", "consumers": {"slow": {"apply-timeout": "2m"}}}}
    )
    group = settings.group("projections")
    assert group.apply_timeout_for("slow") == 120.0
    assert group.apply_timeout_for("other") == 90.0
    assert settings_from_mapping({}).group("routing").apply_timeout_for("any") == 300.0


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        (
            {"apply-timeout": "7s"},
            "projections.apply-timeout (7s) must be above the lock-wait bound: "
            "messaging.consumer.stale-instance-timeout (30s) / 4, at least 1s = 7.5s",
        ),
        (
            {"consumers": {"fast": {"apply-timeout": "0s"}}},
            "projections.consumers.fast.apply-timeout (0s) must be above 0s",
        ),
        (
            {"apply-timeout": "soon"},
            "expected a duration like 10s or 500ms, got 'soon' @ projections.apply-timeout",
        ),
    ],
)
def test_a_timeout_that_cannot_outlast_a_lock_wait_is_refused_naming_both_keys(
    section: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping({"projections": section})
    assert str(raised.value).splitlines()[1:] == [f"  {problem}"]


def test_the_lock_wait_bound_follows_the_stale_instance_timeout() -> None:
    timing = {
        "consumer": {
            "stale-instance-timeout": "8s",
            "heartbeat-interval": "1s",
            "rebalance-interval": "2s",
        }
    }
    ok = settings_from_mapping({"messaging": timing, "projections": {"apply-timeout": "3s"}})
    assert ok.group("projections").apply_timeout == 3.0
    with pytest.raises(ConfigError, match=r"apply-timeout \(2s\) must be above"):
        settings_from_mapping({"messaging": timing, "projections": {"apply-timeout": "2s"}})


def test_a_deadline_fails_the_message_being_handled_once_it_passed() -> None:
    now = [100.0]
    deadline = Deadline(2.5, "a batch", clock=lambda: now[0])
    deadline.check(7)  # in time
    now[0] = 102.6
    with pytest.raises(ApplyTimedOut, match=r"^apply timeout \(2.5s\) exceeded at position 9$"):
        deadline.check(9)
    assert not NO_DEADLINE.passed()


def test_a_deadline_the_watchdog_expired_has_passed_whatever_the_clock_says() -> None:
    deadline = Deadline(60.0, "a batch", clock=lambda: 0.0)
    deadline.expired = True
    assert deadline.passed()
