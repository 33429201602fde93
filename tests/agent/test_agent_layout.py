"""The agent's source stays small and dependency-light (issue 25, item 3).

The agent is bundled into a static single-file binary that runs in any image, and the provider
imports `sandbox_agent.contract`; both rely on what the package imports. Reviewers rely on the
size limits: no module over 600 lines, no function over 80.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import sandbox_agent

PACKAGE = Path(sandbox_agent.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 10, f"expected the agent's modules under {PACKAGE}"
    return modules


def _imported(tree: ast.Module) -> set[str]:
    """Top-level names of every absolute import in `tree` (relative ones are the package)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_over_600_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in _modules()}
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"split these by job (limit {MAX_MODULE_LINES} lines): {over}"


def test_no_function_over_80_lines() -> None:
    over: dict[str, int] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over[f"{path.name}:{node.lineno} {node.name}"] = length
    assert not over, f"split these (limit {MAX_FUNCTION_LINES} lines): {over}"


def test_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "sandbox_agent"}
    for path in _modules():
        foreign = _imported(ast.parse(path.read_text())) - allowed
        assert not foreign, (
            f"{path.name} imports {sorted(foreign)}: the agent runs on the standard library "
            "only (agent/build/build-static.sh bundles nothing else)"
        )


def _relative_imports(tree: ast.Module) -> set[str]:
    return {
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    }


def test_contract_imports_only_the_standard_library() -> None:
    """The provider imports `sandbox_agent.contract` without the agent's server.

    The contract may import `_fields` (the markers of its declarations), which in turn imports
    nothing of the package; both stay within the standard library.
    """
    contract = ast.parse((PACKAGE / "contract.py").read_text())
    fields = ast.parse((PACKAGE / "_fields.py").read_text())
    assert _relative_imports(contract) <= {"_fields"}, _relative_imports(contract)
    assert not _relative_imports(fields), _relative_imports(fields)
    for name, tree in (("contract.py", contract), ("_fields.py", fields)):
        foreign = _imported(tree) - set(sys.stdlib_module_names) - {"__future__"}
        assert not foreign, f"{name} imports {sorted(foreign)}"


# The modules the provider loads with `sandbox_agent.endpoints`, and what each may import of the
# package: the endpoint table, its parameters, the walker that checks replies, and the contract.
_PROVIDER_SIDE = {
    "endpoints.py": {"_params", "_wire", "contract"},
    "_params.py": {"_fields", "_numbers"},
    "_wire.py": {"_fields", "_numbers"},
    "_numbers.py": set(),
}


def test_endpoint_table_imports_only_the_standard_library() -> None:
    """The provider's client builds its requests from `sandbox_agent.endpoints` and checks the
    replies with it, without the agent's server or any of its handlers."""
    for name, allowed in _PROVIDER_SIDE.items():
        tree = ast.parse((PACKAGE / name).read_text())
        assert _relative_imports(tree) <= allowed, (name, _relative_imports(tree))
        foreign = _imported(tree) - set(sys.stdlib_module_names) - {"__future__"}
        assert not foreign, f"{name} imports {sorted(foreign)}"
