"""``on-failure`` per consumer: parsed from the file, per-kind sections, clear errors."""

from __future__ import annotations

import pytest

import projections  # noqa: F401  (registers the kinds and their sections)
import sagas  # noqa: F401
from messaging import ConfigError, Distribution, OnFailure
from messaging._config import settings_from_mapping

HALT, PARK = OnFailure.HALT_PARTITION, OnFailure.PARK_SOURCE


def test_the_consumer_wins_over_its_section_which_wins_over_the_kind_default() -> None:
    settings = settings_from_mapping(
        {
            "projections": {
                "on-failure": "park-source",
                "max-parked-sources": 3,
                "consumers": {"strict": {"on-failure": "halt-partition"}},
            },
            "routing": {"consumers": {"mail": {"on-failure": "park-source"}}},
        }
    )
    group = settings.group("projections")
    assert group.on_failure_for("orders", HALT) is PARK
    assert group.on_failure_for("strict", PARK) is HALT
    assert group.max_parked_sources == 3
    routing = settings.group("routing")
    assert routing.on_failure_for("mail", HALT) is PARK
    assert routing.on_failure_for("other", HALT) is HALT  # the kind's default


def test_a_saga_may_park_its_instances() -> None:
    settings = settings_from_mapping(
        {"sagas": {"consumers": {"trip": {"on-failure": "park-source"}}}}
    )
    assert settings.group("sagas").on_failure_for("trip", HALT) is PARK


def test_a_single_owner_consumer_halts_unless_configured_otherwise() -> None:
    settings = settings_from_mapping(
        {
            "projections": {
                "consumers": {
                    "ordered": {"distribution": "single-owner"},
                    "chosen": {"distribution": "single-owner", "on-failure": "park-source"},
                }
            }
        }
    )
    group = settings.group("projections")
    assert group.distribution_for("ordered") is Distribution.SINGLE_OWNER
    assert group.on_failure_for("ordered", PARK) is HALT
    assert group.on_failure_for("chosen", HALT) is PARK


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"projections": {"on-failure": "park"}},
            "invalid value 'park', expected one of halt-partition, park-source",
        ),
        (
            {"projections": {"max-parked-sources": 0}},
            "projections.max-parked-sources (0) must be 1 or more",
        ),
    ],
)
def test_bad_values_are_named(data: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping(data)
    assert expected in str(raised.value)
