"""The cattrs converter messages are structured with (exact JSON types, no coercion), and
the annotations handlers and typed upcasters are read by."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import cattrs
import cattrs.preconf.json
from cattrs.cols import is_any_set, is_sequence

from messaging._errors import RegistrationError


def strict_converter() -> cattrs.preconf.json.JsonConverter:
    """A JSON converter that refuses wrong types instead of coercing them (no 1.5 -> 1,
    no "7" -> 7, no "abc" -> ["a", "b", "c"]): a payload that does not match its type must
    halt its partition, not be applied differently."""
    converter = cattrs.preconf.json.make_converter(forbid_extra_keys=True)

    def exact(*kinds: type) -> Callable[[Any, Any], Any]:
        def structure(value: Any, cls: Any) -> Any:
            if isinstance(value, bool) and bool not in kinds:
                raise TypeError(f"expected {cls.__name__}, got a boolean")
            if not isinstance(value, kinds):
                raise TypeError(f"expected {cls.__name__}, got {type(value).__name__}")
            number: Any = value
            return float(number) if cls is float else number

        return structure

    converter.register_structure_hook(str, exact(str))
    converter.register_structure_hook(int, exact(int))
    converter.register_structure_hook(float, exact(int, float))
    converter.register_structure_hook(bool, exact(bool))

    # Collections keep cattrs' own hooks (lists, tuples, sets), behind a guard that the
    # JSON value is an array: a string is never split into its characters. The hooks come
    # from a copy taken before the guard exists; collections nested inside collections
    # are structured by that copy, so only the outer array is guarded there.
    unguarded = converter.copy()

    def collection_factory(type_: Any, _conv: Any) -> Callable[[Any, Any], Any]:
        inner = unguarded.get_structure_hook(type_)

        def structure(value: Any, cls: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected an array, got {type(value).__name__}")
            return inner(value, cls)

        return structure

    converter.register_structure_hook_factory(
        lambda t: is_sequence(t) or is_any_set(t), collection_factory
    )
    return converter


def describe(exc: BaseException, what: str = "payload") -> str:
    """One line saying why ``what`` (a payload, a state) could not be structured: each
    field's problem with its path."""
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, path=what))
    return f"{type(exc).__name__}: {exc}"


def type_hints(function: Callable[..., Any], where: str) -> dict[str, Any]:
    """``function``'s resolved annotations; RegistrationError naming ``where`` if they
    cannot be resolved."""
    try:
        return typing.get_type_hints(function)
    except Exception as exc:
        raise RegistrationError(f"{where}: cannot resolve its annotations: {exc}") from exc
