"""One product per package: who may import whom, and `_` means private to its product.

The distribution holds several products over a small shared core. The rules below are the
architecture: the local backend can be read (and replaced) without the provider, Gym users who
install only the provider never load the lab, the CLI or Pulumi, and a product's `_` modules can
change without a sibling breaking. Imports under `if TYPE_CHECKING:` count too: a type-only
import still ties two products together.
"""

from __future__ import annotations

import pytest
from import_graph import cycles, graph, imports, module_names

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


def test_no_import_circle_anywhere_in_the_package() -> None:
    assert cycles(graph()) == []


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
