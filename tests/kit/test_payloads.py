"""The kit's helpers for upcasters: golden payloads and a strategy of old payloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import shapes_app
from clusters import SUPPORT
from effort import examples
from hypothesis import given, settings

from messaging import DecodeError
from messaging._messages import MessageRegistry
from projections.testing import Golden, golden_payloads, old_payloads, read_stored

GOLDEN = golden_payloads(SUPPORT / "golden")


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.path.name)
def test_each_golden_payload_reads_as_expected(golden: Golden) -> None:
    golden.check()


def test_a_golden_payload_that_differs_fails_naming_the_file(tmp_path: Path) -> None:
    wrong = attrs.evolve(GOLDEN[0], expected={**GOLDEN[0].expected, "last_name": "Byron"})
    with pytest.raises(AssertionError) as info:
        wrong.check()
    assert str(info.value).startswith("order-placed-v1.json: shop.order-placed v1 reads as")
    (tmp_path / "bad.json").write_text(json.dumps({"type": "x"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.json: not a golden payload \(KeyError"):
        golden_payloads(tmp_path)


@settings(max_examples=examples(200), deadline=None)
@given(old_payloads(GOLDEN))
def test_every_old_payload_shaped_like_the_golden_ones_reads(
    stored: tuple[str, int, dict[str, Any]],
) -> None:
    """The chains of shapes_app are total: any payload of the old shapes reads."""
    type_name, version, payload = stored
    assert isinstance(read_stored(type_name, version, payload), shapes_app.Sale)


@attrs.define(frozen=True)
class Named:
    name: str


@attrs.define(frozen=True)
class OldNamed:
    full: str


def test_the_strategy_finds_an_upcaster_that_is_not_total() -> None:
    """An upcaster failing on some old payloads (an empty name) is found by a property
    test over the old shape (an attrs class of it)."""
    registry = MessageRegistry()
    registry.register(Named, "named", 2)

    def first_word(payload: dict[str, Any]) -> dict[str, Any]:
        return {"name": payload["full"].split()[0]}

    registry.add_upcaster("named", 1, first_word, "named")

    @settings(max_examples=examples(200), deadline=None, database=None)
    @given(old_payloads({("named", 1): OldNamed}))
    def reads(stored: tuple[str, int, dict[str, Any]]) -> None:
        read_stored(*stored, registry=registry)

    with pytest.raises(DecodeError, match=r"first_word .* failed: IndexError"):
        reads()
