"""One product per package: who may import whom, and `_` means private to its product.

The distribution holds several products over a small shared core. The rules below are the
architecture: the local backend can be read (and replaced) without the provider, Gym users who
install only the provider never load the lab, the CLI or Pulumi, and a product's `_` modules can
change without a sibling breaking. Imports under `if TYPE_CHECKING:` count too: a type-only
import still ties two products together, and two modules into a circle.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from import_graph import AGENT_DIR, INFRA_DIR, cycles, graph, imports, module_names

# product -> the top-level packages that make it up
PRODUCTS: dict[str, tuple[str, ...]] = {
    "core": ("gym_substrate.core", "gym_substrate.ateapi"),
    "nemo": ("gym_substrate.nemo",),
    "local": ("gym_substrate.local",),
    "stack": ("gym_substrate.stack",),
    "envs": ("gym_substrate.envs",),
    "lab": ("gym_substrate.lab",),
    "cli": ("gym_substrate.cli",),
}
# product -> the products it may import (besides itself)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "nemo": frozenset({"core"}),
    "local": frozenset({"core"}),
    "stack": frozenset({"core"}),
    "envs": frozenset({"core", "nemo", "local", "root"}),
    "lab": frozenset({"core", "nemo", "local", "envs", "stack", "root"}),
    "cli": frozenset(PRODUCTS) - {"cli"} | {"root"},
    # `gym_substrate` itself: the flat public names, a facade over the provider
    "root": frozenset({"core", "nemo"}),
}
# product -> third-party packages it must never import (heavy or belonging to another job)
NEVER_IMPORTS: dict[str, frozenset[str]] = {
    "core": frozenset({"aiohttp", "click", "pulumi", "matplotlib", "gymnasium"}),
    "nemo": frozenset({"click", "pulumi", "matplotlib", "gymnasium", "rich"}),
    "local": frozenset({"pulumi", "matplotlib", "gymnasium"}),
    "stack": frozenset({"aiohttp", "matplotlib", "gymnasium"}),
    "envs": frozenset({"pulumi", "click", "matplotlib"}),
}


def product_of(module: str) -> str | None:
    """The product a module of ours belongs to, "root" for `gym_substrate`, None if not ours."""
    if module == "gym_substrate":
        return "root"
    for product, packages in PRODUCTS.items():
        if any(module == p or module.startswith(p + ".") for p in packages):
            return product
    return None


def is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a rule, as one readable line each."""
    found = []
    for module, targets in sorted(edges.items()):
        owner = product_of(module)
        if owner is None:
            found.append(f"{module}: belongs to no product (add it to PRODUCTS)")
            continue
        for target in sorted(targets):
            other = product_of(target)
            if other is None:
                top = target.split(".")[0]
                if top in NEVER_IMPORTS.get(owner, ()):
                    found.append(f"{module} imports {target}: {owner} must not use {top}")
                continue
            if other == owner:
                continue
            if other not in MAY_IMPORT[owner]:
                found.append(f"{module} imports {target}: {owner} may not import {other}")
            elif is_private(target):
                found.append(f"{module} imports {target}: a private module of {other}")
    return found


def test_every_module_belongs_to_a_product() -> None:
    assert [m for m in module_names() if product_of(m) is None] == []


def test_products_import_only_the_layers_below_them() -> None:
    assert violations(graph(type_checking=True)) == []


# Import circles still being taken apart: none since issue 33 took the gVisor runtime's last
# one apart (runtime, freezer, warm pool, adoption). None may join, and one gone must leave.
CIRCLES_ALLOWED: list[list[str]] = []


def test_no_import_circle_anywhere_in_the_package() -> None:
    """Type-only imports count: a circle under `if TYPE_CHECKING:` is still two modules that
    cannot be read, tested or replaced one without the other."""
    found = cycles(graph(type_checking=True))
    assert [c for c in found if c not in CIRCLES_ALLOWED] == []
    fixed = [c for c in CIRCLES_ALLOWED if c not in found]
    assert not fixed, f"these circles are gone: remove them from CIRCLES_ALLOWED: {fixed}"


def test_a_circle_through_a_type_only_import_is_found(tmp_path: Path) -> None:
    """The circle test sees a circle closed only under `if TYPE_CHECKING:` (as the control
    plane's parts once imported `ControlPlane` back), and would fail on it."""
    sources = {
        "gym_substrate.a": "from gym_substrate import b\n",
        "gym_substrate.b": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from gym_substrate.a import A\n"
        ),
    }
    paths = {}
    for name, text in sources.items():
        paths[name] = tmp_path / f"{name.rsplit('.', 1)[1]}.py"
        paths[name].write_text(text)
    known = set(sources) | {"gym_substrate"}

    def edges(*, type_checking: bool) -> dict[str, set[str]]:
        return {n: imports(n, p, known, type_checking=type_checking) for n, p in paths.items()}

    assert cycles(edges(type_checking=True)) == [["gym_substrate.a", "gym_substrate.b"]]
    assert cycles(edges(type_checking=False)) == []  # what the test used to look at


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        (
            {"gym_substrate.local.backend": {"gym_substrate.nemo.errors"}},
            "local may not import nemo",
        ),
        (
            {"gym_substrate.nemo.provider": {"gym_substrate.lab.experiments"}},
            "nemo may not import lab",
        ),
        ({"gym_substrate.nemo.provider": {"pulumi.dynamic"}}, "nemo must not use pulumi"),
        (
            {"gym_substrate.cli.arm": {"gym_substrate.lab.experiments._arm"}},
            "a private module of lab",
        ),
        ({"gym_substrate.stack.config": {"gym_substrate.core.errors"}}, None),
        ({"gym_substrate.lab.bench.env": {"gym_substrate.nemo._exec"}}, "a private module of nemo"),
    ],
)
def test_the_rules_see_each_kind_of_breach(
    edges: dict[str, set[str]], expected: str | None
) -> None:
    found = violations(edges)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1, found
        assert expected in found[0]


def test_the_graph_sees_lazy_and_type_only_imports() -> None:
    modules = module_names()
    runtimes = "gym_substrate.local.runtimes"
    factory = imports(runtimes, modules[runtimes], set(modules))
    assert "gym_substrate.local.runtimes.process" in factory  # imported inside create_runtime
    root = imports("gym_substrate", modules["gym_substrate"], set(modules), type_checking=True)
    assert "gym_substrate.nemo.provider" in root  # only under TYPE_CHECKING
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_the_public_names_are_written_once_and_all_resolve() -> None:
    """`gym_substrate/__init__.py` names its exports once (its TYPE_CHECKING imports, explicit
    re-exports for type checkers); `__all__` and the lazy look-up come from them, and every
    name resolves to a class or value whose public path is `gym_substrate`."""
    import gym_substrate

    assert set(gym_substrate.__all__) == {*gym_substrate._EXPORTS, "__version__"}
    assert {"SubstrateProvider", "UnsupportedServerError", "SupportsSandboxSnapshot"} <= set(
        gym_substrate.__all__
    )
    for name in gym_substrate._EXPORTS:
        value = getattr(gym_substrate, name)
        if isinstance(value, type):
            assert value.__module__ == "gym_substrate", name


def _outside(edges: dict[str, set[str]], allowed: Callable[[str], bool]) -> list[str]:
    return [
        f"{m} imports {t}" for m, ts in sorted(edges.items()) for t in sorted(ts) if not allowed(t)
    ]


def test_the_agent_has_no_circle_and_needs_only_the_standard_library() -> None:
    """The sandbox agent runs inside every sandbox, on any image's Python: nothing of ours
    beside itself, nothing from PyPI; and its modules form no circle."""
    edges = graph(type_checking=True, root=AGENT_DIR, top="sandbox_agent")
    assert len(edges) >= 20  # the whole agent was read
    assert cycles(edges) == []

    def allowed(target: str) -> bool:
        top = target.split(".")[0]
        return top == "sandbox_agent" or top in sys.stdlib_module_names

    assert _outside(edges, allowed) == []


def test_the_pulumi_program_uses_the_stack_product_only() -> None:
    """`infra/` is the stack product's Pulumi entry point: it imports the stack's public
    modules (and core), never the provider, the local backend or a private module."""
    edges = graph(type_checking=True, root=INFRA_DIR, top="infra")
    assert "infra.__main__" in edges
    assert cycles(edges) == []

    def allowed(target: str) -> bool:
        top = target.split(".")[0]
        if top == "gym_substrate":
            return product_of(target) in ("stack", "core") and not is_private(target)
        return top in ("infra", "pulumi") or top in sys.stdlib_module_names

    assert _outside(edges, allowed) == []
