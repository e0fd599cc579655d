"""Upcaster chains: validated at start-up with one line naming the type; resolved from
every stored (type, version) to the current class; current versions keep the generated
decoder."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from messaging import DecodeError, RegistrationError
from messaging._errors import UnknownPayloadVersion
from messaging._messages import MessageRegistry


@attrs.define(frozen=True)
class Order:
    order_id: str
    total: int
    currency: str


def _bump(payload: dict[str, Any]) -> dict[str, Any]:
    amount = payload.pop("amount")
    return {**payload, "total": amount}


def _currency(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "currency": "EUR"}


def _other(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def _registry(version: int = 3) -> MessageRegistry:
    registry = MessageRegistry()
    registry.register(Order, "order", version)
    return registry


def test_a_full_chain_is_accepted_and_reads_every_version() -> None:
    registry = _registry()
    registry.add_upcaster("order", 1, _bump, "order")
    registry.add_upcaster("order", 2, _currency, "order")
    registry.check_upcasters()
    v1 = json.dumps({"order_id": "a", "amount": 5})
    v2 = json.dumps({"order_id": "a", "total": 5})
    v3 = json.dumps({"order_id": "a", "total": 5, "currency": "EUR"})
    expected = Order("a", 5, "EUR")
    assert registry.reader("order", 1)(v1, 7) == expected
    assert registry.reader("order", 2)(v2, 7) == expected
    assert registry.reader("order", 3)(v3, 7) == expected
    assert registry.reader("order", 3) is registry.decoder("order")  # the generated one


def test_a_gap_is_one_line_naming_the_type_and_version() -> None:
    registry = _registry()
    registry.add_upcaster("order", 2, _currency, "order")
    with pytest.raises(RegistrationError) as info:
        registry.check_upcasters()
    assert str(info.value) == (
        "message type 'order' is at version 3 but no upcaster reads its version 1: "
        "declare @upcaster('order', 1)"
    )


def test_a_bumped_class_without_upcasters_is_refused() -> None:
    with pytest.raises(RegistrationError, match="'order' is at version 2 but no upcaster"):
        _registry(2).check_upcasters()


def test_two_upcasters_from_one_version_are_refused_at_once() -> None:
    registry = _registry()
    registry.add_upcaster("order", 1, _bump, "order")
    registry.add_upcaster("order", 1, _bump, "order")  # the same function again: fine
    with pytest.raises(RegistrationError) as info:
        registry.add_upcaster("order", 1, _other, "order")
    assert "message type 'order' version 1 has two upcasters" in str(info.value)
    assert "\n" not in str(info.value)


def test_an_upcaster_from_the_current_version_is_refused() -> None:
    registry = _registry(2)
    registry.add_upcaster("order", 1, _bump, "order")
    registry.add_upcaster("order", 2, _currency, "order")
    with pytest.raises(RegistrationError, match=r"reads version 2 of 'order', but its class"):
        registry.check_upcasters()


def test_a_chain_leading_nowhere_is_refused() -> None:
    registry = _registry(1)
    registry.add_upcaster("legacy", 1, _bump, "purchase")
    with pytest.raises(RegistrationError) as info:
        registry.check_upcasters()
    assert "'legacy' v1 -> 'purchase' v2" in str(info.value)
    assert str(info.value).endswith(
        "it leads to 'purchase', which is no current class and no upcaster or rename leads on from"
    )


def test_renames_going_round_are_refused() -> None:
    registry = _registry(1)
    registry.add_rename("a", "b")
    registry.add_rename("b", "a")
    with pytest.raises(RegistrationError, match="renames go round: a -> b -> a"):
        registry.check_upcasters()


def test_a_rename_of_a_current_class_and_a_double_rename_are_refused() -> None:
    registry = _registry(1)
    registry.add_rename("order", "x")
    with pytest.raises(RegistrationError, match="'order' is the name of a current class"):
        registry.check_upcasters()
    registry = _registry(1)
    registry.add_rename("old", "order")
    with pytest.raises(RegistrationError, match="renamed twice"):
        registry.add_rename("old", "other")


def test_a_rename_reads_the_old_name_at_every_version() -> None:
    registry = _registry(2)
    registry.add_rename("purchase", "order")
    registry.add_upcaster("purchase", 1, _currency, "purchase")
    registry.check_upcasters()
    v1 = json.dumps({"order_id": "a", "total": 5})
    assert registry.reader("purchase", 1)(v1, None) == Order("a", 5, "EUR")
    found = registry.readers_of("order")
    assert sorted((name, sorted(v)) for name, v in found.items()) == [
        ("order", [2]),
        ("purchase", [1, 2]),
    ]


def test_a_newer_version_is_unknown_and_an_older_one_without_upcaster_is_a_gap() -> None:
    registry = _registry(2)
    registry.add_upcaster("order", 1, _currency, "order")
    with pytest.raises(UnknownPayloadVersion) as newer:
        registry.reader("order", 3)("{}", 9)
    assert "needs a newer declaration of type 'order' version 3" in str(newer.value)
    assert newer.value.position == 9


def test_an_upcaster_returning_what_the_class_cannot_read_is_named() -> None:
    registry = _registry(2)
    registry.add_upcaster("order", 1, _other, "order")
    with pytest.raises(DecodeError) as info:
        registry.reader("order", 1)(json.dumps({"order_id": "a"}), 3)
    message = str(info.value)
    assert message.startswith("cannot decode message at position 3 of type 'order': after upcaster")
    assert "_other" in message and "currency" in message


def test_an_upcaster_returning_a_non_dict_is_named() -> None:
    registry = _registry(2)
    registry.add_upcaster("order", 1, lambda payload: [payload], "order")  # a bad one
    with pytest.raises(DecodeError, match="returned list, not a dict or attrs instance"):
        registry.reader("order", 1)("{}", None)


@pytest.mark.parametrize("version", [0, -1, "2", 1.0])
def test_bad_versions_are_refused(version: Any) -> None:
    with pytest.raises(RegistrationError, match="at least 1"):
        MessageRegistry().register(Order, "order", version)
    with pytest.raises(RegistrationError, match="at least 1"):
        MessageRegistry().add_upcaster("order", version, _bump, "order")


def test_decode_with_the_stored_version_upcasts() -> None:
    registry = _registry(2)
    registry.add_upcaster("order", 1, _currency, "order")
    stored = json.dumps({"order_id": "a", "total": 5})
    assert registry.decode("order", stored, 1, version=1) == Order("a", 5, "EUR")
    with pytest.raises(DecodeError, match="currency"):
        registry.decode("order", stored, 1)  # read as the current version: it is not


@attrs.define(frozen=True)
class OrderV1:
    """The first shape of ``order``: an amount, no currency."""

    order_id: str
    amount: int


@attrs.define(frozen=True)
class OrderV2:
    order_id: str
    total: int


def _typed_total(old: OrderV1) -> OrderV2:
    return OrderV2(old.order_id, old.amount)


def _typed_currency(old: OrderV2) -> Order:
    return Order(old.order_id, old.total, "EUR")


def test_typed_upcasters_take_and_return_attrs_classes_of_each_shape() -> None:
    """A typed upcaster gets the stored payload as its old-shape class and may return an
    instance of the next shape (or the current class); typed and dict steps mix."""
    registry = _registry()
    registry.add_upcaster("order", 1, _typed_total, "order")
    registry.add_upcaster("order", 2, _typed_currency, "order")
    registry.check_upcasters()
    assert registry.reader("order", 1)('{"order_id": "a", "amount": 5}', 1) == Order("a", 5, "EUR")
    mixed = _registry()
    mixed.add_upcaster("order", 1, _bump, "order")
    mixed.add_upcaster("order", 2, _typed_currency, "order")
    assert mixed.reader("order", 1)('{"order_id": "a", "amount": 5}', 1) == Order("a", 5, "EUR")


def test_a_payload_that_does_not_fit_a_typed_upcasters_old_shape_is_named() -> None:
    registry = _registry(2)
    registry.add_upcaster("order", 1, _typed_total, "order")
    with pytest.raises(DecodeError) as info:
        registry.reader("order", 1)('{"order_id": "a"}', 4)
    message = str(info.value)
    assert "position 4" in message and "_typed_total" in message and "failed" in message


def test_a_typed_upcaster_with_an_unresolvable_annotation_or_two_arguments_is_refused() -> None:
    def unresolved(old: Missing) -> dict[str, Any]:  # type: ignore[name-defined]  # noqa: F821
        return {}

    def two(payload: dict[str, Any], extra: int) -> dict[str, Any]:
        return payload

    with pytest.raises(RegistrationError, match="unresolved: cannot resolve its annotations"):
        MessageRegistry().add_upcaster("order", 1, unresolved, "order")
    with pytest.raises(RegistrationError, match="two must take one argument"):
        MessageRegistry().add_upcaster("order", 1, two, "order")  # type: ignore[arg-type]


def test_the_upcasters_on_the_ways_to_a_class_are_listed_for_the_operator() -> None:
    registry = _registry()
    registry.add_upcaster("order", 1, _typed_total, "order")
    registry.add_upcaster("order", 2, _currency, "order")
    registry.add_rename("purchase", "order")
    assert registry.upcasts_to("order") == [
        "rename 'purchase' -> 'order'",
        f"upcaster {__name__}._currency ('order' v2 -> 'order' v3)",
        f"upcaster {__name__}._typed_total ('order' v1 -> 'order' v2)",
    ]
