"""Testing upcasters: golden payloads and a Hypothesis strategy of old payloads.

A *golden payload* is a JSON file holding a payload as an older version stored it and
what the current class must read from it::

    {"type": "shop.order-placed", "version": 1,
     "payload": {"order_id": "o1", "amount": 10, "customer": "Ada Lovelace"},
     "expected": {"type": "shop.sale", "payload": {"order_id": "o1", "amount": 10, ...}}}

``expected`` is the current type name and the current class's payload (as the store would
write it). Parametrize a test over :func:`golden_payloads` and call :meth:`Golden.check`.

:func:`old_payloads` draws payloads of older versions shaped like examples (golden
payloads, dicts, or attrs classes of the old shapes), so a property test can show that
every chain is total: whatever an older version stored, the current class reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs.preconf.json
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from messaging.kinds import MessageRegistry
from messaging.operations import registry as default_registry

__all__ = ["Golden", "golden_payloads", "old_payloads", "read_stored", "shaped_like"]

_unstructure = cattrs.preconf.json.make_converter().unstructure


def read_stored(
    type_name: str,
    version: int,
    payload: str | Mapping[str, Any],
    *,
    registry: MessageRegistry = default_registry,
) -> Any:
    """What every consumer reads from ``payload`` stored as (``type_name``, ``version``):
    through the upcasters for an older version (DecodeError naming the step that failed)."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return registry.reader(type_name, version)(text, None)


@attrs.frozen
class Golden:
    """One golden payload file (see the module's documentation)."""

    path: Path
    type: str
    version: int
    payload: Mapping[str, Any]
    expected_type: str
    expected: Mapping[str, Any]

    def check(self, registry: MessageRegistry = default_registry) -> None:
        """AssertionError naming the file and what differs unless the current classes read
        the stored payload as expected."""
        message = read_stored(self.type, self.version, self.payload, registry=registry)
        name, payload = registry.encode(message)
        actual = json.loads(payload)
        if (name, actual) != (self.expected_type, dict(self.expected)):
            raise AssertionError(
                f"{self.path.name}: {self.type} v{self.version} reads as {name} {actual}, "
                f"expected {self.expected_type} {dict(self.expected)}"
            )


def golden_payloads(directory: str | Path) -> list[Golden]:
    """The golden payloads of ``directory`` (``*.json``, by name); ValueError naming a
    file that is not one."""
    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            expected = data["expected"]
            golden = Golden(
                path=path,
                type=data["type"],
                version=data["version"],
                payload=data["payload"],
                expected_type=expected["type"],
                expected=expected["payload"],
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}: not a golden payload ({type(exc).__name__}: {exc}); expected "
                '{"type", "version", "payload", "expected": {"type", "payload"}}'
            ) from None
        found.append(golden)
    return found


def shaped_like(example: Any) -> SearchStrategy[Any]:
    """JSON values of the shape of ``example``: the same keys, each value drawn of the same
    JSON type (strings, integers, floats, booleans, lists of the first item's shape)."""
    if isinstance(example, bool):
        return st.booleans()
    if isinstance(example, int):
        return st.integers(-(2**53), 2**53)
    if isinstance(example, float):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(example, str):
        return st.text(max_size=20)
    if isinstance(example, list):
        return st.lists(shaped_like(example[0]), max_size=4) if example else st.just([])
    if isinstance(example, dict):
        return st.fixed_dictionaries({key: shaped_like(value) for key, value in example.items()})
    return st.just(example)


def old_payloads(
    shapes: Mapping[tuple[str, int], Any] | Iterable[Golden],
) -> SearchStrategy[tuple[str, int, dict[str, Any]]]:
    """``(type, version, payload)`` of older versions, each shaped like its example: a
    golden payload's, a dict, or an attrs class of the old shape (built by Hypothesis)."""
    if not isinstance(shapes, Mapping):
        shapes = {(g.type, g.version): dict(g.payload) for g in shapes}
    if not shapes:
        raise ValueError("old_payloads needs at least one (type, version) and its shape")
    choices = []
    for (type_name, version), shape in sorted(shapes.items()):
        if isinstance(shape, type) and attrs.has(shape):
            attrs.resolve_types(shape)  # (annotations as strings: ``from __future__``)
            payloads: SearchStrategy[Any] = st.builds(shape).map(_unstructure)
        else:
            payloads = shaped_like(shape)
        choices.append(payloads.map(_tagged(type_name, version)))
    return st.one_of(choices)


def _tagged(type_name: str, version: int) -> Any:
    def tag(payload: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
        return type_name, version, payload

    return tag
