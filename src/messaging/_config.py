"""Load :class:`~messaging._settings.Settings` from YAML, failing at start with the key's path.

YAML keys are the settings' field names in kebab-case, and the sections of the
registered consumer kinds (:func:`messaging._settings.consumer_sections`: a kind's section
is known once the package defining the kind is imported). Every problem found while
structuring (unknown key, bad duration, wrong type, unknown enum value) becomes one
line ``<reason> @ <dotted.kebab.path>``; the start-up rules of
:func:`messaging._settings.validate` run as the settings are built.
"""

from __future__ import annotations

import enum
import functools
import os
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

import attrs
import yaml
from cattrs import Converter
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)
from cattrs.gen import make_dict_structure_fn, make_mapping_structure_fn, override

from messaging._errors import ConfigError, RegistrationError
from messaging._settings import (
    ConsumerGroupSettings,
    ConsumerOverride,
    Distribution,
    InvalidSettings,
    OnFailure,
    Settings,
    consumer_sections,
)

__all__ = [
    "ADMIN_TOKEN_ENV",
    "DATABASE_URL_ENV",
    "load_settings",
    "parse_duration",
    "settings_from_mapping",
]

#: Environment variable that overrides the configured database URL.
DATABASE_URL_ENV = "PROJECTIONS_DATABASE_URL"
#: Environment variable that overrides the configured admin token (``admin.token``).
ADMIN_TOKEN_ENV = "PROJECTIONS_ADMIN_TOKEN"

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(ms|s|m|h)?\s*", re.ASCII)
_UNIT_SECONDS = {"ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600)}
_HEADER = "invalid configuration:"


def parse_duration(text: str | float) -> float:
    """Parse ``"10s"``, ``"500ms"``, ``"1.5s"``, ``"2m"`` or ``"1h"`` into float seconds; a
    plain number (``"2.5"``, or a number in YAML) is seconds, as everywhere (the CLI, the
    HTTP API, :func:`~messaging.wait_for`).

    Surrounding whitespace and a space before the unit are allowed. Raises
    :class:`ValueError` for anything else, including negative numbers.
    """
    given: object = text
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = repr(text) if isinstance(text, float) else str(text)  # a YAML number
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"expected a duration like 10s or 500ms, got {_show(given)}")
    number, unit = match.groups()
    seconds = float(Decimal(number) * _UNIT_SECONDS[unit or "s"])
    if seconds == float("inf"):
        raise ValueError(f"duration {match.group(0).strip()!r} is too large")
    return seconds


def settings_from_mapping(data: Mapping[str, Any]) -> Settings:
    """Structure parsed YAML into :class:`Settings` and check the start-up rules.

    Raises :class:`ConfigError` starting with ``"invalid configuration:"`` and listing
    one problem per line.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_HEADER}\n  expected a mapping, got {_kind(data)} @ (top level)")
    sections = tuple(consumer_sections())
    try:
        shaped: Any = _converter.structure(data, _file_shape(sections))
    except (ClassValidationError, IterableValidationError) as exc:
        lines = _error_lines(exc, ())
        raise ConfigError(_HEADER + "\n" + "\n".join(f"  {line}" for line in lines)) from None
    groups = {section: getattr(shaped, section) for section in sections if section in data}
    own = attrs.asdict(shaped, recurse=False)
    for section in sections:
        del own[section]
    return Settings(**own, consumer_groups=groups)


@functools.cache
def _file_shape(sections: tuple[str, ...]) -> type:
    """The keys of a settings file: those of :class:`Settings` (but ``consumer_groups``)
    and one :class:`ConsumerGroupSettings` per section of the registered consumer kinds."""
    own = {a.name: a for a in attrs.fields(attrs.resolve_types(Settings))}
    del own["consumer_groups"]
    taken = [section for section in sections if section in own]
    if taken:
        raise RegistrationError(f"consumer kind sections {taken} are names of settings")
    fields = {name: attrs.field(type=a.type, default=a.default) for name, a in own.items()}
    for section in sections:
        fields[section] = attrs.field(type=ConsumerGroupSettings, factory=ConsumerGroupSettings)
    return attrs.make_class("SettingsFile", fields, frozen=True, kw_only=True)


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    database: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read settings from the YAML file at ``path`` (``None``: no file, all defaults).

    The database URL comes from, in order: the ``database`` argument (``--database``),
    the ``PROJECTIONS_DATABASE_URL`` environment variable (ignored when empty), the
    file's ``database`` key, the default ``sqlite:///projections.db``. The admin token
    comes from ``PROJECTIONS_ADMIN_TOKEN`` (ignored when empty), else ``admin.token``.
    ``environ`` defaults to :data:`os.environ`.

    Raises :class:`ConfigError` for a missing or unreadable file, invalid YAML (with
    line and column), a top level that is not a mapping, or invalid settings.
    """
    data: Any = None
    if path is not None:
        data = _read_yaml(os.fspath(path))
    if data is None:
        data = {}
    elif not isinstance(data, Mapping):
        raise ConfigError(
            f"{os.fspath(path or '')}: the top level must be a mapping of settings, "
            f"got {_kind(data)}"
        )
    try:
        settings = settings_from_mapping(data)
    except ConfigError as exc:
        if path is None:
            raise
        raise ConfigError(f"{os.fspath(path)}: {exc}") from None

    env = os.environ if environ is None else environ
    url = database if database is not None else env.get(DATABASE_URL_ENV) or None
    if url is not None and url != settings.database:
        settings = attrs.evolve(settings, database=url)  # validated again as it is built
    token = env.get(ADMIN_TOKEN_ENV) or None
    if token is not None and token != settings.admin.token:
        try:
            settings = attrs.evolve(settings, admin=attrs.evolve(settings.admin, token=token))
        except ConfigError as exc:
            raise ConfigError(f"${ADMIN_TOKEN_ENV}: {exc}") from None
    return settings


def _read_yaml(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read configuration file: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{path}: invalid YAML at {where}: {reason}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None


# --- the converter ---------------------------------------------------------------------


def _show(value: object) -> str:
    """A value as a YAML user would recognise it in a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _kind(value: object) -> str:
    """What was found instead of the expected value, for a message."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple | set):
        return "a list"
    if isinstance(value, str):
        return f"string {value!r}"
    return _show(value)


def _structure_duration(value: object, _: type) -> float:
    return parse_duration(value)  # type: ignore[arg-type]  # parse_duration checks the type


def _structure_int(value: object, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {_kind(value)}")
    return value


def _structure_bool(value: object, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {_kind(value)}")
    return value


def _structure_str(value: object, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_kind(value)}")
    return value


def _structure_names(value: object, _: type) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"expected a list of names, got {_kind(value)}")
    return tuple(value)


E = TypeVar("E", bound=enum.Enum)


def _structure_choice(value: object, cl: type[E]) -> E:
    if isinstance(value, cl):
        return value
    for member in cl:
        if value == member.value:
            return member
    expected = ", ".join(member.value for member in cl)
    raise ValueError(f"invalid value {_show(value)}, expected one of {expected}")


def _yaml_key(field_name: str) -> str:
    return field_name.replace("_", "-")


def _require_mapping(
    structure: Callable[[Mapping[str, Any], Any], Any],
) -> Callable[[object, Any], Any]:
    def hook(value: object, cl: Any) -> Any:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a mapping, got {_kind(value)}")
        return structure(value, cl)

    return hook


def _make_converter() -> Converter:
    """A converter for the settings classes: kebab-case keys, no unknown keys, strict types."""
    converter = Converter(forbid_extra_keys=True, detailed_validation=True)

    def attrs_hook(cl: type) -> Callable[[object, Any], Any]:
        # Any: mypy would match these field overrides against the _cattrs_* flags.
        renames: dict[str, Any] = {
            a.name: override(rename=_yaml_key(a.name)) for a in attrs.fields(cl)
        }
        return _require_mapping(
            make_dict_structure_fn(cl, converter, _cattrs_forbid_extra_keys=True, **renames)
        )

    # Every float setting is a duration in seconds.
    converter.register_structure_hook(float, _structure_duration)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(Distribution, _structure_choice)
    converter.register_structure_hook(OnFailure, _structure_choice)
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _structure_names)
    converter.register_structure_hook_factory(attrs.has, attrs_hook)
    overrides = dict[str, ConsumerOverride]
    converter.register_structure_hook_func(
        lambda t: t == overrides,
        _require_mapping(make_mapping_structure_fn(overrides, converter)),
    )
    return converter


_converter = _make_converter()


def _error_lines(exc: BaseException, path: tuple[str, ...]) -> list[str]:
    """One ``<reason> @ <path>`` line per leaf of a cattrs validation error tree."""
    if isinstance(exc, ClassValidationError):
        with_notes, others = exc.group_exceptions()
        lines: list[str] = []
        for sub, note in with_notes:
            lines += _error_lines(sub, (*path, _yaml_key(note.name)))
        for sub in others:
            lines += _error_lines(sub, path)
        return lines
    if isinstance(exc, IterableValidationError):
        with_index, rest = exc.group_exceptions()
        lines = []
        for sub, index_note in with_index:
            lines += _error_lines(sub, (*path, str(index_note.index)))
        for sub in rest:
            lines += _error_lines(sub, path)
        return lines
    if isinstance(exc, InvalidSettings):
        return exc.problems  # the start-up rules, checked as the settings were built
    where = ".".join(path) or "(top level)"
    if isinstance(exc, ForbiddenExtraKeysError):
        return [f"unknown key {_show(key)} @ {where}" for key in sorted(exc.extra_fields, key=str)]
    return [f"{str(exc) or type(exc).__name__} @ {where}"]
