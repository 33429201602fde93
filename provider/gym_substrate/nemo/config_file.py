"""Read a Gym `sandbox:` YAML block without Hydra, for the CLI tools (smoke, sweep, bench).

Gym resolves `${oc.env:VAR,default}` with OmegaConf before it calls the provider; the tools must
accept the very same file, and OmegaConf is not a runtime dependency, so this module implements
exactly that one resolver. Like OmegaConf's, it yields strings (`null` -> None) that the
config coerces.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.nemo.errors import ConfigError

__all__ = ["load_substrate_block"]

_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


def _resolve(value: Any, path: str) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def lookup(match: re.Match[str]) -> str | None:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise ConfigError(
                f"{path}: environment variable {name} is not set and ${{oc.env:{name}}} has no "
                "default; export it or write ${oc.env:" + name + ",<default>}"
            )
        default = default.strip()
        if len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":
            return default[1:-1]
        return None if default == "null" else default

    whole = _REF.fullmatch(value.strip())
    if whole is not None:  # like OmegaConf: a string, or None for a `null` default
        return lookup(whole)
    if re.search(r"\$\{(?!oc\.env:)", value):
        raise ConfigError(f"{path}: only ${{oc.env:VAR,default}} interpolation is supported")
    return _REF.sub(lambda m: lookup(m) or "", value)


def load_substrate_block(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the keyword arguments of the `substrate` provider from a Gym sandbox YAML file.

    The file holds a top-level block (conventionally `sandbox:`) whose one provider key is
    `substrate`; `default_metadata` is allowed beside it.
    """
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{file}: expected a mapping with a `sandbox:` block")
    blocks = {k: v for k, v in doc.items() if isinstance(v, dict) and "substrate" in v}
    if "sandbox" in doc:
        name = "sandbox"
    elif len(blocks) == 1:
        name = next(iter(blocks))
    else:
        raise ConfigError(
            f"{file}: expected one top-level block (e.g. `sandbox:`) holding a `substrate:` key"
        )
    block = doc[name]
    if not isinstance(block, dict):
        raise ConfigError(f"{file}: {name}: expected a mapping")
    providers = [k for k in block if k != "default_metadata"]
    if providers != ["substrate"]:
        raise ConfigError(
            f"{file}: {name}: must hold exactly one provider key, `substrate` "
            f"(plus optional default_metadata); found {', '.join(map(str, providers)) or 'none'}"
        )
    kwargs = _resolve(block["substrate"] or {}, f"{name}.substrate")
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{file}: {name}.substrate: expected a mapping")
    return kwargs
