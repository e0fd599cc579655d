"""What differs between two read-model states, as data and as sentences."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.define(frozen=True)
class Difference:
    """One key whose value differs: ``key`` is None when the states are not mappings."""

    key: Any
    expected: object
    actual: object

    def sentence(self, template: str = "{key} is {actual} where {expected} was expected") -> str:
        """E.g. ``acct-0 is ('ada', 1, 1) where ('ada', 2, 2) was expected``: ``template``
        with the key and both values filled in."""
        key = "the read model" if self.key is None else str(self.key)
        return template.format(key=key, actual=repr(self.actual), expected=repr(self.expected))


def differences(expected: object, actual: object) -> list[Difference]:
    """The keys whose values differ (for two mappings, by key), or one difference of the
    whole states; empty when they are equal."""
    if expected == actual:
        return []
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        keys = sorted({*expected, *actual}, key=repr)
        return [
            Difference(key, expected.get(key), actual.get(key))
            for key in keys
            if expected.get(key) != actual.get(key)
        ]
    return [Difference(None, expected, actual)]


class ReadModelDiffers(AssertionError):
    """The read models differ from the expected state (an assertion, for the test run)."""

    def __init__(
        self,
        expected: object,
        actual: object,
        template: str = "{key} is {actual} where {expected} was expected",
        what: str = "the expected state",
    ) -> None:
        self.differences = differences(expected, actual)
        self.template = template
        """How :meth:`Difference.sentence` says each difference."""
        if isinstance(expected, Mapping) and isinstance(actual, Mapping):
            wrong = {d.key: (d.expected, d.actual) for d in self.differences}
            text = f"read model differs from {what}, (expected, actual) by key: {wrong}"
        else:
            text = f"read model differs from {what}:\n{expected!r} expected\n{actual!r} stored"
        super().__init__(text)
