"""The hot paths' JSON text is what ``json.dumps`` writes."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging._json import make_dumps

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(values)
def test_the_same_text_as_json_dumps(value: object) -> None:
    assert make_dumps()(value) == json.dumps(value)
    assert make_dumps(",", ":")(value) == json.dumps(value, separators=(",", ":"))


def test_what_json_cannot_hold_is_refused_as_json_dumps_refuses_it() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        make_dumps()({"when": object()})
    assert make_dumps()(math.inf) == "Infinity"
