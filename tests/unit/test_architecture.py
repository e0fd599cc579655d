"""ARCHITECTURE.md stays true: every package under ``src/`` and ``plugins/`` is described in
its "Layers and packages" block, and every module, class, function or method it names in
backticks (``applying._fence.Fence.guard``) exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
TOPS = ("messaging", "projections", "sagas")
"""Where a name in backticks is looked up: as written, else under one of these."""
ENGINE = {p.name for p in (ROOT / "src" / "messaging").iterdir() if (p / "__init__.py").exists()}


def _layers_block() -> str:
    section = TEXT.split("## Layers and packages", 1)[1]
    return section.split("```", 2)[1]


def _packages() -> list[Path]:
    found = [*(ROOT / "src").rglob("__init__.py"), *(ROOT / "plugins").rglob("__init__.py")]
    return sorted(p.parent for p in found)


def test_every_package_is_described() -> None:
    block = _layers_block()
    missing = []
    for package in _packages():
        parts = package.relative_to(ROOT).parts[1:]  # under src/ or plugins/
        top = len(parts) == 1 and package.parent.name == "src"
        named = re.search(rf"^{parts[-1]}\b", block, re.M) if top else f"{parts[-1]}/" in block
        if not named:
            missing.append("/".join(parts))
    assert not missing, f"packages not described in ARCHITECTURE.md: {missing}"


def _references() -> set[str]:
    """The dotted names in backticks that point into the code: a name starting with a
    package or a private module of ``messaging`` (``runtime._units.Units``)."""
    names = set(re.findall(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)`", TEXT))
    firsts = {*TOPS, *ENGINE}
    return {n for n in names if n.split(".")[0] in firsts or n.startswith("_")}


def _resolves(name: str) -> bool:
    for candidate in (name, *(f"{top}.{name}" for top in TOPS)):
        parts = candidate.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attribute in parts[cut:]:
                    found = getattr(found, attribute)
            except AttributeError:
                break
            return True
    return False


def test_every_name_it_gives_exists() -> None:
    references = _references()
    assert len(references) > 40  # the path of a message, the parts of an instance...
    missing = sorted(name for name in references if not _resolves(name))
    assert not missing, f"ARCHITECTURE.md names what does not exist: {missing}"
