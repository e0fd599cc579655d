"""The quick id test agrees with the full check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.store._rows import check_id, is_plain_id


@given(st.text(max_size=210) | st.integers() | st.none())
def test_the_quick_test_passes_exactly_what_the_check_accepts(value: object) -> None:
    try:
        check_id("id", value)
    except ValueError:
        assert not is_plain_id(value)
    else:
        assert is_plain_id(value)


@pytest.mark.parametrize("value", ["", " a", "a\n", "x" * 201, 7])
def test_refused_ids(value: object) -> None:
    assert not is_plain_id(value)
    with pytest.raises(ValueError):
        check_id("id", value)


@pytest.mark.parametrize("version", [0, -1, "2", True, 1.0])
def test_a_new_message_refuses_a_payload_version_below_1_or_not_an_integer(version: object) -> None:
    from messaging import NewMessage

    with pytest.raises(ValueError, match="payload_version must be an integer of at least 1"):
        NewMessage(topic="t", source="s", type="x", payload="{}", payload_version=version)  # type: ignore[arg-type]  # bad input on purpose
