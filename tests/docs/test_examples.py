"""Every ``python`` block of README.md and docs/ runs (Sybil), so that no example rots.

Each page runs in order in one namespace, in a temporary folder of its own that is the
current folder and on ``sys.path``. A block after the words "save this as `NAME.py`"
(or a YAML block after "Beside it, `NAME.yaml`") is also written there as that file, so
that later blocks import or read it. Fragments get their context from
``<!-- invisible-code-block: python -->`` comments; ``<!-- skip: next "reason" -->``
marks the rare block that cannot run here (counted in the report).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import SkipTest

import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from messaging._messages import registry

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_NAMED = re.compile(r"(?:save this as|beside it,) `([\w.-]+\.(?:py|yaml))`", re.I)
COUNTS = {"run": 0, "skipped": 0}
_SKIP = re.compile(r'<!-- skip: (?:next|start) "([^"]*)" -->')


def _file_name(example: Example) -> str | None:
    """The file the text just before ``example`` asks to save it as, if any."""
    before = example.document.text[max(0, example.start - 400) : example.start]
    names = _NAMED.findall(before)
    return names[-1] if names else None


def _save(example: Example) -> None:
    name = _file_name(example)
    if name is not None and name.endswith((".py", ".yaml")):
        Path(name).write_text(str(example.parsed), encoding="utf-8")


_python = PythonEvaluator()


def _run_python(example: Example) -> Any:
    """A block saved as a module is imported as the reader would run it (``python
    NAME.py`` runs the same code), its names then in the page's namespace; any other
    block runs in the namespace."""
    name = _file_name(example)
    invisible = example.document.text.startswith("<!--", example.start)
    if invisible or name is None or not name.endswith(".py"):
        return _python(example)
    _save(example)
    module = importlib.import_module(name.removesuffix(".py"))
    example.namespace.update(
        {key: value for key, value in vars(module).items() if not key.startswith("__")}
    )
    return None


def _save_yaml(example: Example) -> None:
    _save(example)


SYBIL = Sybil(
    parsers=[
        CodeBlockParser(language="python", evaluator=_run_python),
        CodeBlockParser(language="yaml", evaluator=_save_yaml),
        SkipParser(),
    ]
)


@pytest.fixture
def page_folder(tmp_path: Path) -> Iterator[Path]:
    """The page's own folder: current, on ``sys.path``; modules imported from it are
    forgotten afterwards (two pages may both save a ``bank.py``)."""
    before = os.getcwd()
    os.chdir(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        os.chdir(before)
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
                del sys.modules[name]


@pytest.fixture
def own_messages() -> Iterator[None]:
    """The message types a page registers are forgotten afterwards: a page may name its
    messages as the test applications do (``shop.sale``), in the same test process."""
    by_name, versions = dict(registry._by_name), dict(registry._versions)
    decoders = dict(registry._decoders)
    upcasts, renames = dict(registry.upcasters._upcasts), dict(registry.upcasters._renames)
    try:
        yield
    finally:
        registry._by_name.clear()
        registry._by_name.update(by_name)
        registry._versions.clear()
        registry._versions.update(versions)
        registry._decoders.clear()
        registry._decoders.update(decoders)
        registry.upcasters._upcasts.clear()
        registry.upcasters._upcasts.update(upcasts)
        registry.upcasters._renames.clear()
        registry.upcasters._renames.update(renames)
        registry._readers.clear()
        registry._unstructurers.clear()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page: Path, page_folder: Path, own_messages: None) -> None:
    document = SYBIL.parse(page)
    document.namespace["__name__"] = "docs_example"
    try:
        for example in document.examples():
            visible_python = example.region.evaluator is _run_python and not (
                document.text.startswith("<!--", example.start)
            )
            try:
                example.evaluate()
            except SkipTest:
                COUNTS["skipped"] += visible_python
                continue
            COUNTS["run"] += visible_python
    finally:
        for cleanup in document.namespace.get("cleanups", []):
            cleanup()


def test_skipped_blocks_are_few_and_say_why() -> None:
    """A block is skipped only with a reason, and most blocks run."""
    skips = [m for page in PAGES for m in _SKIP.finditer(page.read_text(encoding="utf-8"))]
    blocks = sum(page.read_text(encoding="utf-8").count("```python") for page in PAGES)
    assert all(m.group(1).strip() for m in skips), "a skip without its reason"
    assert blocks >= 15 and len(skips) <= blocks // 3, (blocks, len(skips))
