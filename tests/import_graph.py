"""The package's import graph, read from the source, for the layer and circle tests.

Every `import` counts, also those inside functions (which is how the old `runtime.py` <->
`process.py` circle hid), so reading it needs no optional dependency installed. The implicit
import of a module's parent package is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gym_substrate

PACKAGE_DIR = Path(gym_substrate.__file__).parent
REPO = PACKAGE_DIR.parent.parent
# the other products beside the package: the sandbox agent and the Pulumi program
AGENT_DIR, INFRA_DIR = REPO / "agent" / "sandbox_agent", REPO / "infra"


def module_names(root: Path = PACKAGE_DIR, top: str = "gym_substrate") -> dict[str, Path]:
    """Every module under ``root`` by dotted name under ``top`` (packages by their own name)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = (top, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: str, path: Path, modules: set[str], *, type_checking: bool = False) -> set[str]:
    """What `module` imports, as dotted names: ours resolved to modules, others as written.

    Imports under `if TYPE_CHECKING:` never run; they count only with `type_checking=True`
    (the layer rules and the circle test both ask for them: a type-only import still ties
    two modules together).
    """
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
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
    return {name for name in found if name != module}


def graph(
    *, type_checking: bool = False, root: Path = PACKAGE_DIR, top: str = "gym_substrate"
) -> dict[str, set[str]]:
    """Each of our modules -> the modules it imports (ours and third-party, by top name)."""
    modules = module_names(root, top)
    known = set(modules)
    return {
        name: imports(name, path, known, type_checking=type_checking)
        for name, path in modules.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
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
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
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

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return out
