"""Plugin management: the application's modules and installed packages are pluggy plugins.

Start-up runs in a fixed order: add the hook specifications, register the built-in
plugin, load the ``projections`` entry-point group (unless
``PROJECTIONS_DISABLE_PLUGIN_AUTOLOAD`` is set), register the application modules,
then check that every hook implementation matches a specification.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Iterable, Sequence
from types import ModuleType

import pluggy

from messaging import _hookspecs as hookspecs
from messaging._consumers import ConsumerSpec, collect_specs, is_consumer
from messaging._errors import RegistrationError
from messaging._hookspecs import hookimpl
from messaging._kinds import registered_kinds
from messaging._messages import MessageRegistry
from messaging._messages import registry as default_registry

ENTRY_POINT_GROUP = "projections"
DISABLE_AUTOLOAD_ENV = "PROJECTIONS_DISABLE_PLUGIN_AUTOLOAD"


class ApplicationModules:
    """Built-in plugin: contributes the decorated consumer classes defined in app modules."""

    def __init__(self) -> None:
        self.modules: list[ModuleType] = []

    @hookimpl
    def projections_consumers(self) -> list[type]:
        found = []
        for module in self.modules:
            for value in vars(module).values():
                if is_consumer(value) and value.__module__ == module.__name__:
                    found.append(value)
        return found


def import_module(name: str) -> ModuleType:
    """Import an application module by dotted name, with an error that names it."""
    try:
        return importlib.import_module(name)
    except RegistrationError:
        raise
    except Exception as exc:
        raise RegistrationError(
            f"cannot import application module {name!r}: {type(exc).__name__}: {exc}"
        ) from exc


def create_plugin_manager(
    modules: Iterable[str | ModuleType] = (),
    *,
    plugins: Iterable[object] = (),
    load_entrypoints: bool | None = None,
) -> pluggy.PluginManager:
    """A plugin manager with the app ``modules`` and extra ``plugins`` registered, checked."""
    manager = pluggy.PluginManager("projections")
    manager.add_hookspecs(hookspecs)
    application = ApplicationModules()
    manager.register(application, name="projections-application-modules")
    if load_entrypoints is None:
        load_entrypoints = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if load_entrypoints:
        _load_entry_points(manager)
    for module in modules:
        loaded = import_module(module) if isinstance(module, str) else module
        application.modules.append(loaded)
        if manager.is_registered(loaded):
            continue
        _register(manager, loaded, loaded.__name__)
    for plugin in plugins:
        _register(manager, plugin, None)
    for kind in registered_kinds():  # the application modules may have registered kinds
        if kind.hookspecs is not None:
            manager.add_hookspecs(kind.hookspecs)
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise RegistrationError(f"plugin {exc.plugin!r}: {exc}") from exc
    return manager


def _load_entry_points(manager: pluggy.PluginManager) -> None:
    """Register the installed plugins of the ``projections`` entry-point group."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if manager.get_plugin(entry_point.name) is not None:
            continue
        where = f"entry point {entry_point.name!r} ({entry_point.value})"
        if entry_point.dist is not None:
            where += f" of {entry_point.dist.name}"
        try:
            plugin = entry_point.load()
        except Exception as exc:
            raise RegistrationError(
                f"installed plugin {where} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            manager.register(plugin, name=entry_point.name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise RegistrationError(f"installed plugin {where}: {exc}") from exc


def _register(manager: pluggy.PluginManager, plugin: object, name: str | None) -> None:
    try:
        manager.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise RegistrationError(f"plugin {name or plugin!r}: {exc}") from exc
    except ValueError as exc:  # already registered under that name
        raise RegistrationError(f"plugin {name or plugin!r}: {exc}") from exc


def collect_consumers(
    manager: pluggy.PluginManager, registry: MessageRegistry = default_registry
) -> list[ConsumerSpec]:
    """Every consumer the plugins contribute, validated; duplicate names fail with both classes."""
    classes: list[type] = []
    for contributed in manager.hook.projections_consumers():
        classes.extend(_as_classes(contributed))
    return collect_specs(classes, registry)


def _as_classes(contributed: Sequence[type] | None) -> list[type]:
    if contributed is None:
        return []
    if isinstance(contributed, type | str) or not isinstance(contributed, Iterable):
        raise RegistrationError(
            f"projections_consumers must return a list of classes, got {contributed!r}"
        )
    items = list(contributed)
    for item in items:
        if not isinstance(item, type):
            raise RegistrationError(
                f"projections_consumers returned {item!r}, which is not a class"
            )
    return items
