"""No import circle runs through the local backend.

The graph is read from the source (every `import`, also those inside functions, which is how the
old `runtime.py` <-> `process.py` circle hid), so it needs no optional dependency installed.
Imports under `if TYPE_CHECKING:` never run and are left out, and so is the implicit import of a
module's parent package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gym_substrate

PACKAGE_DIR = Path(gym_substrate.__file__).parent


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = ("gym_substrate", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, modules: set[str]) -> set[str]:
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                # `from pkg import submodule` depends on the submodule, not on all of pkg
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return {name for name in found if name in modules and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return out


def test_the_graph_sees_lazy_imports() -> None:
    modules = _module_names()
    factory = _imports(
        "gym_substrate.local.runtimes", modules["gym_substrate.local.runtimes"], set(modules)
    )
    assert "gym_substrate.local.runtimes.process" in factory  # imported inside create_runtime
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_import_circle_through_the_local_backend() -> None:
    modules = _module_names()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    local = [
        cycle
        for cycle in _cycles(graph)
        if any(name.startswith("gym_substrate.local") for name in cycle)
    ]
    assert local == []


def test_no_import_circle_anywhere_in_the_package() -> None:
    """Issue 9 asks for no import circle at all: the provider, bench, cli and experiments too."""
    modules = _module_names()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    assert _cycles(graph) == []
