"""scripts/import_cycles.py finds each knot of modules importing one another, and only those."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_cycles.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_knots_are_the_cycles_largest_first() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"},
        "e": {"d", "outside"},  # d <-> e; an import of a module not in the graph is ignored
        "f": {"a"},  # imports into a cycle without being in it
        "g": {"g"},  # imports itself
    }
    assert _script().knots(graph) == [["a", "b", "c"], ["d", "e"], ["g"]]


def test_a_graph_without_cycles_has_no_knots() -> None:
    assert _script().knots({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_source_tree_is_read() -> None:
    graph = _script().import_graph()
    assert "messaging.applying._worker" in graph
    assert "messaging.applying._batch" in graph["messaging.applying._worker"]
