"""Count the import cycles among the modules under ``src/`` (type-only imports included).

Run as ``python scripts/import_cycles.py``: prints each knot of modules that import one
another in a cycle (a strongly connected component of the import graph, built by grimp,
import-linter's graph library), largest first, and how many there are; exits 1 if there
is any. The goal is 0 (issue 38): a module that needs another's names at run time only
must not import it inside a function to dodge a cycle."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

import grimp

PACKAGES = ("messaging", "projections", "sagas")


def knots(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (or a
    module importing itself), each sorted, largest first (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of :data:`PACKAGES` it imports (at any level of the file)."""
    graph = grimp.build_graph(*PACKAGES)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def main() -> int:
    found = knots(import_graph())
    for knot in found:
        print(f"{len(knot)} modules in a cycle: {', '.join(knot)}")
    print(f"{len(found)} import cycle(s) among the modules of {', '.join(PACKAGES)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
