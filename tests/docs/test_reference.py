"""The generated reference pages match the code: regenerated in memory, they equal what is
committed, and they name every settings key and every command."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import attrs

from messaging._settings import ConsumerGroupSettings, ConsumerOverride, Settings, consumer_sections

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "scripts" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_reference", module)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_up_to_date() -> None:
    for path, text in _generator().pages().items():
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        assert committed == text, (
            f"{path.relative_to(ROOT)} is out of date: run python scripts/gen_reference.py"
        )


def _keys(cls: type, prefix: str = "") -> set[str]:
    keys = set()
    for field in attrs.fields(attrs.resolve_types(cls)):
        key = prefix + field.name.replace("_", "-")
        keys.add(key)
        if isinstance(field.type, type) and attrs.has(field.type):
            keys |= _keys(field.type, key + ".")
    return keys


def test_every_settings_key_is_in_the_configuration_page() -> None:
    page = _generator().configuration_page()
    expected = _keys(Settings) - {"consumer-groups"}
    for section in consumer_sections():
        expected |= _keys(ConsumerGroupSettings, section + ".")
        expected |= _keys(ConsumerOverride, f"{section}.consumers.NAME.")
    missing = sorted(key for key in expected if f"| `{key}` |" not in page)
    assert missing == []


def test_every_command_and_option_is_in_the_cli_page() -> None:
    generator = _generator()
    page = generator.cli_page()
    commands = generator._commands(generator.build_parser())
    assert len(commands) >= 20
    for name, _, parser in commands:
        assert f"## `projections {name}`" in page
        for action in parser._actions:
            for option in action.option_strings:
                assert option in ("-h", "--help") or option in page, (name, option)
