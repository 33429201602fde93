"""Test modules must be importable side by side, or pytest stops the whole run at collection.

pytest's default import mode puts each test folder that is not a package on `sys.path` and
imports its modules by basename, so two `test_templates.py` in two plain folders collide and
the run ends with "import file mismatch" before any test runs (CI run of stop 26, 18 s).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _import_name(path: Path) -> str:
    """The dotted name pytest imports `path` as: up through the packages above it."""
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def test_no_two_test_modules_import_under_the_same_name() -> None:
    seen: dict[str, list[Path]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") or path.name == "conftest.py":
            seen[_import_name(path)].append(path.relative_to(TESTS))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1 and name != "conftest"}
    assert not clashes, f"rename one of each, or make its folder a package: {clashes}"


def test_no_module_is_over_700_lines() -> None:
    """The project's size limit for a module (generated protobuf stubs excepted)."""
    repo = TESTS.parent
    sizes = {
        str(path.relative_to(repo)): len(path.read_text().splitlines())
        for folder in ("provider", "agent", "infra")
        for path in (repo / folder).rglob("*.py")
        if "_pb2" not in path.name and ".venv" not in path.parts
    }
    assert len(sizes) > 100, "the walk found the sources"
    over = {name: lines for name, lines in sizes.items() if lines > 700}
    assert not over, f"split these by job: {over}"
