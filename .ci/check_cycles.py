"""Fail when the package's import graph has a cycle (a strongly connected set of modules).

import-linter's layers contract forbids imports between packages in the wrong direction; this
check adds what it cannot see: a cycle among modules of one package (`a` imports `b` imports
`a`), counting imports inside functions and under TYPE_CHECKING, as grimp (import-linter's
graph library) reads them. Run by `make lint`.
"""

from __future__ import annotations

import sys

import grimp

PACKAGE = "zephon_nodes"


def cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def main() -> int:
    """Print each cycle and return 1 if there is any."""
    graph = grimp.build_graph(PACKAGE)
    modules = sorted(m for m in graph.modules if m.startswith(PACKAGE))
    edges = {
        m: sorted(x for x in graph.find_modules_directly_imported_by(m) if x.startswith(PACKAGE))
        for m in modules
    }
    found = cycles(edges)
    for component in found:
        print(f"import cycle of {len(component)} modules: {', '.join(component)}")
    if found:
        print(f"{len(found)} import cycle(s) in {PACKAGE}: break each (docs/architecture.md)")
        return 1
    print(f"no import cycle among {len(modules)} modules of {PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
