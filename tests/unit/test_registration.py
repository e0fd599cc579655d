"""Consumer registration through pluggy: app modules, plugin objects, entry points, errors."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from messaging import (
    HandlerContext,
    RegistrationError,
    collect_consumers,
    create_plugin_manager,
    handler,
    hookimpl,
    message,
)
from messaging._consumers import consumer_spec
from messaging._plugins import DISABLE_AUTOLOAD_ENV
from projections import in_memory_projection, projection
from projections._kinds import IN_MEMORY_PROJECTION, PROJECTION
from projections.examples import ledger


@message("test.reg.happened")
@attrs.define(frozen=True)
class Happened:
    what: str


@message("test.reg.other")
@attrs.define(frozen=True)
class Other:
    n: int


@attrs.define(frozen=True)
class Unregistered:
    """An attrs class never decorated with @message."""

    what: str


@projection("test-reg-extra", topics="reg", partitions=3)
class ExtraConsumer:
    @handler
    def on(self, event: Happened, ctx: HandlerContext) -> None:
        pass


@projection("ledger-balances", topics="reg")
class ClashingConsumer:
    @handler
    def on(self, event: Happened) -> None:
        pass


class ExtraPlugin:
    """A plugin object contributing one consumer."""

    @hookimpl
    def projections_consumers(self) -> list[type]:
        return [ExtraConsumer]


ModuleWriter = Callable[[str], str]


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleWriter]:
    """Write a module into tmp_path under a fresh name, importable; return its name.

    ``{mod}`` in the source is replaced by the module's name (for unique type names).
    """
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(source: str) -> str:
        name = f"regmod_{uuid.uuid4().hex[:10]}"
        text = textwrap.dedent(source).replace("{mod}", name)
        (tmp_path / f"{name}.py").write_text(text, encoding="utf-8")
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


CONSUMER_MODULE = """\
    import attrs
    from messaging import handler, message
    from projections import projection

    @message("test.reg.{mod}.event")
    @attrs.define(frozen=True)
    class Event:
        key: str

    @projection("{consumer}", topics="reg")
    class {cls}:
        @handler
        def on(self, event: Event) -> None:
            pass
"""


def _consumer_module(write_module: ModuleWriter, consumer: str, cls: str) -> str:
    return write_module(CONSUMER_MODULE.replace("{consumer}", consumer).replace("{cls}", cls))


# -- collecting ------------------------------------------------------------------------------


def test_ledger_module_contributes_its_two_consumers() -> None:
    """Naming the ledger module collects ledger-balances and ledger-activity."""
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    specs = {spec.name: spec for spec in collect_consumers(manager)}
    assert sorted(specs) == ["ledger-activity", "ledger-balances"]
    balances, activity = specs["ledger-balances"], specs["ledger-activity"]
    assert balances.cls is ledger.Balances
    assert balances.kind is PROJECTION
    assert balances.partitions == 8
    assert balances.topics == ("ledger",)
    assert balances.transactional
    assert balances.type_names() == [
        "ledger.account-opened",
        "ledger.deposited",
        "ledger.transfer-credited",
        "ledger.transfer-debited",
        "ledger.transfer-received",
        "ledger.transfer-refunded",
        "ledger.transfer-sent",
        "ledger.withdrawn",
    ]
    assert activity.kind is IN_MEMORY_PROJECTION
    assert not activity.transactional
    assert activity.handler_arity[ledger.AccountOpened] == 1
    assert balances.handler_arity[ledger.AccountOpened] == 2


def test_module_object_works_like_its_name() -> None:
    """A module may be given as an object instead of its dotted name, even twice."""
    manager = create_plugin_manager([ledger, "projections.examples.ledger"], load_entrypoints=False)
    assert [s.name for s in collect_consumers(manager)] == ["ledger-activity", "ledger-balances"]


def test_plugin_object_contributes_a_consumer() -> None:
    """A plugin object implementing projections_consumers adds its consumers to the app's."""
    manager = create_plugin_manager(
        ["projections.examples.ledger"], plugins=[ExtraPlugin()], load_entrypoints=False
    )
    specs = {spec.name: spec for spec in collect_consumers(manager)}
    assert sorted(specs) == ["ledger-activity", "ledger-balances", "test-reg-extra"]
    assert specs["test-reg-extra"].cls is ExtraConsumer
    assert specs["test-reg-extra"].partitions == 3


def test_only_consumers_defined_in_the_module_are_collected(write_module: ModuleWriter) -> None:
    """A consumer class merely imported into an app module is not collected from it."""
    name = write_module(
        CONSUMER_MODULE.replace("{consumer}", "test-reg-own").replace("{cls}", "Own")
        + "\n    from projections.examples.ledger import Balances\n"
    )
    manager = create_plugin_manager([name], load_entrypoints=False)
    assert [s.name for s in collect_consumers(manager)] == ["test-reg-own"]


def test_duplicate_consumer_names_across_plugins_name_both_classes() -> None:
    """Two plugins contributing one consumer name fail with RegistrationError naming both."""

    class ClashPlugin:
        @hookimpl
        def projections_consumers(self) -> list[type]:
            return [ClashingConsumer]

    manager = create_plugin_manager(
        ["projections.examples.ledger"], plugins=[ClashPlugin()], load_entrypoints=False
    )
    with pytest.raises(RegistrationError) as info:
        collect_consumers(manager)
    text = str(info.value)
    assert "ledger-balances" in text
    assert "projections.examples.ledger.Balances" in text
    assert f"{__name__}.ClashingConsumer" in text


def test_duplicate_consumer_names_across_modules_name_both_classes(
    write_module: ModuleWriter,
) -> None:
    """Two app modules declaring the same consumer name fail, naming both classes."""
    first = _consumer_module(write_module, "test-reg-dup", "First")
    second = _consumer_module(write_module, "test-reg-dup", "Second")
    manager = create_plugin_manager([first, second], load_entrypoints=False)
    with pytest.raises(RegistrationError) as info:
        collect_consumers(manager)
    assert f"{first}.First" in str(info.value)
    assert f"{second}.Second" in str(info.value)


def test_plugin_returning_a_single_class_is_refused() -> None:
    """projections_consumers must return a list; a bare class is a RegistrationError."""

    class BarePlugin:
        @hookimpl
        def projections_consumers(self) -> type:
            return ExtraConsumer

    manager = create_plugin_manager(plugins=[BarePlugin()], load_entrypoints=False)
    with pytest.raises(RegistrationError, match="list of classes"):
        collect_consumers(manager)


@pytest.mark.parametrize("item", ["not-a-class", 42, ExtraPlugin()])
def test_plugin_returning_non_classes_is_refused(item: object) -> None:
    """A non-class in a projections_consumers result is a RegistrationError, not a crash."""

    class OddPlugin:
        @hookimpl
        def projections_consumers(self) -> list[object]:
            return [item]

    manager = create_plugin_manager(plugins=[OddPlugin()], load_entrypoints=False)
    with pytest.raises(RegistrationError):
        collect_consumers(manager)


def test_plugin_returning_an_undecorated_class_is_refused() -> None:
    """A contributed class that no decorator marked is a RegistrationError naming it."""

    class Undecorated:
        pass

    class OddPlugin:
        @hookimpl
        def projections_consumers(self) -> list[type]:
            return [Undecorated]

    manager = create_plugin_manager(plugins=[OddPlugin()], load_entrypoints=False)
    with pytest.raises(RegistrationError, match="Undecorated"):
        collect_consumers(manager)


# -- declaration errors -----------------------------------------------------------------------


def test_projection_without_handlers_is_refused() -> None:
    """A projection with no @handler methods fails to register, naming the consumer and class."""

    @projection("test-reg-no-handlers", topics="reg")
    class NoHandlers:
        def not_a_handler(self, event: Happened) -> None:
            pass

    with pytest.raises(RegistrationError) as info:
        consumer_spec(NoHandlers)
    assert "test-reg-no-handlers" in str(info.value)
    assert "NoHandlers" in str(info.value)
    assert "no handlers" in str(info.value)


def test_handler_for_unregistered_message_type_is_refused() -> None:
    """A handler whose message type is not a registered message fails, naming type and handler."""

    @projection("test-reg-unregistered", topics="reg")
    class Consumer:
        @handler
        def on(self, event: Unregistered) -> None:
            pass

    with pytest.raises(RegistrationError) as info:
        consumer_spec(Consumer)
    assert "Unregistered" in str(info.value)
    assert "Consumer.on" in str(info.value)


def test_handler_without_annotation_is_refused() -> None:
    """A handler whose message parameter has no annotation fails, naming the parameter."""

    @projection("test-reg-unannotated", topics="reg")
    class Consumer:
        @handler
        def on(self, event) -> None:  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(RegistrationError) as info:
        consumer_spec(Consumer)
    assert "Consumer.on" in str(info.value)
    assert "'event'" in str(info.value)


def test_handler_with_unresolvable_annotation_is_refused() -> None:
    """A handler annotated with a name that cannot be resolved fails with RegistrationError."""

    @projection("test-reg-unresolvable", topics="reg")
    class Consumer:
        @handler
        def on(self, event: NoSuchName) -> None:  # type: ignore[name-defined]  # noqa: F821
            pass

    with pytest.raises(RegistrationError, match=r"Consumer\.on"):
        consumer_spec(Consumer)


@pytest.mark.parametrize("arity", [0, 3])
def test_handler_with_wrong_arity_is_refused(arity: int) -> None:
    """A handler must take (self, message) or (self, message, context)."""
    if arity == 0:

        def on(self: object) -> None:
            pass

    else:

        def on(  # type: ignore[misc]  # the two arities differ on purpose
            self: object, event: Happened, ctx: HandlerContext, extra: int
        ) -> None:
            pass

    cls = type("WrongArity", (), {"on": handler(on)})
    projection(f"test-reg-arity-{arity}", topics="reg")(cls)
    with pytest.raises(RegistrationError) as info:
        consumer_spec(cls)
    assert "WrongArity.on" in str(info.value)
    assert "(self, message)" in str(info.value)


def test_message_type_handled_twice_is_refused() -> None:
    """Two handlers of one message type in one consumer fail, naming both."""

    @projection("test-reg-twice", topics="reg")
    class Twice:
        @handler
        def first(self, event: Happened) -> None:
            pass

        @handler
        def second(self, event: Happened) -> None:
            pass

    with pytest.raises(RegistrationError) as info:
        consumer_spec(Twice)
    assert "first" in str(info.value)
    assert "second" in str(info.value)


@pytest.mark.parametrize("partitions", [0, -1, 4097, "8", 2.5])
def test_partitions_out_of_range_are_refused(partitions: object) -> None:
    """A partition count outside 1..4096 (or not an integer) fails at decoration."""
    with pytest.raises(RegistrationError) as info:

        @projection("test-reg-partitions", topics="reg", partitions=partitions)  # type: ignore[arg-type]
        class Consumer:
            @handler
            def on(self, event: Happened) -> None:
                pass

    assert "test-reg-partitions" in str(info.value)
    assert "partitions" in str(info.value)


@pytest.mark.parametrize("partitions", [1, 4096])
def test_partition_bounds_are_accepted(partitions: int) -> None:
    """The partition counts 1 and 4096 are allowed."""

    @projection("test-reg-bounds", topics="reg", partitions=partitions)
    class Consumer:
        @handler
        def on(self, event: Happened) -> None:
            pass

    assert consumer_spec(Consumer).partitions == partitions


@pytest.mark.parametrize("topics", [(), [""], "", [None]])
def test_empty_topics_are_refused(topics: object) -> None:
    """A consumer needs at least one non-empty topic."""
    with pytest.raises(RegistrationError, match="topics"):
        projection("test-reg-topics", topics=topics)(type("T", (), {}))  # type: ignore[arg-type]


def test_decorating_a_non_class_or_without_a_name_is_refused() -> None:
    """Only classes can be consumers, and their name must be a non-empty string."""
    with pytest.raises(RegistrationError):
        projection("test-reg-function", topics="reg")(lambda: None)  # type: ignore[type-var]
    with pytest.raises(RegistrationError):
        in_memory_projection("", topics="reg")(type("Nameless", (), {}))


def test_a_name_holding_the_version_mark_is_refused() -> None:
    """``NAME@2`` names version 2 of projection NAME: no consumer may be named so."""
    with pytest.raises(RegistrationError, match="'@' is reserved for a projection's versions"):
        projection("test-reg@2", topics="reg")(type("Versioned", (), {}))


def test_undecorated_class_is_not_a_consumer() -> None:
    """consumer_spec of a class without a consumer decorator fails naming the class."""
    with pytest.raises(RegistrationError, match="ExtraPlugin"):
        consumer_spec(ExtraPlugin)


# -- plugin and module errors -------------------------------------------------------------------


def test_module_that_fails_to_import_is_named(write_module: ModuleWriter) -> None:
    """An app module raising at import fails with RegistrationError naming it and the cause."""
    name = write_module('raise RuntimeError("exploded at import")\n')
    with pytest.raises(RegistrationError) as info:
        create_plugin_manager([name], load_entrypoints=False)
    assert repr(name) in str(info.value)
    assert "exploded at import" in str(info.value)


def test_missing_module_is_named() -> None:
    """A module that does not exist fails with RegistrationError naming it."""
    with pytest.raises(RegistrationError, match="no_such_app_module_xyz"):
        create_plugin_manager(["no_such_app_module_xyz"], load_entrypoints=False)


def test_misspelled_hook_fails_at_check_pending() -> None:
    """A hookimpl whose name matches no hookspec fails the start with RegistrationError."""

    class Misspelled:
        @hookimpl
        def projections_consumer(self) -> list[type]:
            return [ExtraConsumer]

    with pytest.raises(RegistrationError, match="projections_consumer"):
        create_plugin_manager(plugins=[Misspelled()], load_entrypoints=False)


def test_misspelled_hook_in_a_module_names_the_module(write_module: ModuleWriter) -> None:
    """A misspelled hook in an app module fails naming that module."""
    name = write_module(
        """\
        from messaging import hookimpl

        @hookimpl
        def projections_instance_start(instance_id, name, consumers):
            pass
        """
    )
    with pytest.raises(RegistrationError) as info:
        create_plugin_manager([name], load_entrypoints=False)
    assert "projections_instance_start" in str(info.value)
    assert name in str(info.value)


def test_hookimpl_with_unknown_argument_is_refused() -> None:
    """A hookimpl asking for an argument its hookspec does not offer is a RegistrationError."""

    class BadArgs:
        @hookimpl
        def projections_partition_claimed(self, consumer: str, owner: str) -> None:
            pass

    with pytest.raises(RegistrationError, match="owner"):
        create_plugin_manager(plugins=[BadArgs()], load_entrypoints=False)


# -- entry points -------------------------------------------------------------------------------


PLUGIN_MODULE = """\
    import attrs
    from messaging import handler, hookimpl, message
    from projections import projection

    @message("test.reg.{mod}.event")
    @attrs.define(frozen=True)
    class Event:
        key: str

    @projection("test-reg-from-entry-point-{mod}", topics="reg")
    class FromEntryPoint:
        @handler
        def on(self, event: Event) -> None:
            pass

    @hookimpl
    def projections_consumers():
        return [FromEntryPoint]
"""


def _install_dist(tmp_path: Path, module: str, entry_name: str = "fake") -> None:
    dist = f"fakeplugin_{module}"
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        f"[projections]\n{entry_name} = {module}\n", encoding="utf-8"
    )


def test_entry_point_plugin_is_loaded(
    tmp_path: Path, write_module: ModuleWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed distribution in the ``projections`` group is loaded and adds its consumers."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    module = write_module(PLUGIN_MODULE)
    _install_dist(tmp_path, module)
    manager = create_plugin_manager(["projections.examples.ledger"])
    assert manager.get_plugin("fake") is sys.modules[module]
    names = [s.name for s in collect_consumers(manager)]
    assert names == ["ledger-activity", "ledger-balances", f"test-reg-from-entry-point-{module}"]


@pytest.mark.parametrize("value", ["1", "yes"])
def test_entry_point_autoload_can_be_disabled(
    tmp_path: Path, write_module: ModuleWriter, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """With PROJECTIONS_DISABLE_PLUGIN_AUTOLOAD set, installed plugins are not loaded."""
    module = write_module(PLUGIN_MODULE)
    _install_dist(tmp_path, module)
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, value)
    manager = create_plugin_manager()
    assert manager.get_plugin("fake") is None
    assert collect_consumers(manager) == []
    assert module not in sys.modules


def test_entry_points_can_be_disabled_by_argument(
    tmp_path: Path, write_module: ModuleWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_entrypoints=False skips installed plugins even without the environment variable."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    module = write_module(PLUGIN_MODULE)
    _install_dist(tmp_path, module)
    assert collect_consumers(create_plugin_manager(load_entrypoints=False)) == []


def test_entry_point_plugin_that_fails_to_import_is_named(
    tmp_path: Path, write_module: ModuleWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed plugin that cannot be imported fails with RegistrationError naming it."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    module = write_module('raise RuntimeError("plugin exploded")\n')
    _install_dist(tmp_path, module, entry_name="broken")
    with pytest.raises(RegistrationError, match=module):
        create_plugin_manager()


def test_entry_point_plugin_with_bad_hookimpl_is_a_registration_error(
    tmp_path: Path, write_module: ModuleWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed plugin with an invalid hookimpl fails with RegistrationError naming it."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    module = write_module(
        """\
        from messaging import hookimpl

        @hookimpl
        def projections_partition_claimed(consumer, owner):
            pass
        """
    )
    _install_dist(tmp_path, module, entry_name="badargs")
    with pytest.raises(RegistrationError, match="badargs"):
        create_plugin_manager()
