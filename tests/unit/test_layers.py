"""The layering: ``messaging`` imports neither ``projections`` nor ``sagas``, and no module
under ``src/`` grows past the size a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_messaging_imports_no_consumer_kind_package() -> None:
    offending = []
    modules = sorted((SRC / "messaging").rglob("*.py"))
    assert len(modules) > 20  # the walk found the package
    for path in modules:
        for name in _imported(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in {"projections", "sagas"}:
                offending.append(f"{path.relative_to(SRC)} imports {name}")
    assert offending == []


def test_the_walk_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from sagas._worker import SagaWorker\n    import projections\n")
    assert _imported(tree) == {"sagas._worker", "projections"}
