"""Shared by the scripts that run inside the NeMo Gym chroot (Python 3.13, nemo-gym 0.7.0).

`steps()` collects named checks: each runs, records ok/detail/seconds, and a failure does not stop
the others (a step may depend on an earlier one; then it fails too, naming the cause). `finish()`
prints the one `RESULT <json>` line the host-side test parses and exits 1 if any step failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

CONFIG = os.environ.get("GYM_T_CONFIG", "/cfg/substrate.yaml")


def gym_config(*paths: str) -> Any:
    """The merged global config as Gym builds it from `config_paths` (no CLI, no env.yaml)."""
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
    from omegaconf import DictConfig, OmegaConf

    initial = OmegaConf.merge(
        GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT,
        DictConfig({"config_paths": list(paths or (CONFIG,))}),
    )
    return GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=initial)


def provider_config(name: str = "sandbox", *paths: str) -> dict[str, Any]:
    """`{"substrate": {...}}` through Gym's own `resolve_provider_config`."""
    from nemo_gym.sandbox.config import resolve_provider_config

    return resolve_provider_config(name, gym_config(*paths))


class Steps:
    def __init__(self) -> None:
        self.results: dict[str, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}

    def run(self, name: str, func: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            value = func()
        except BaseException as exc:  # noqa: BLE001 - every failure is a result
            self.results[name] = {
                "ok": False,
                "detail": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
                "seconds": round(time.monotonic() - started, 3),
            }
            return None
        self.results[name] = {
            "ok": True,
            "detail": "" if value is None else str(value)[:2000],
            "seconds": round(time.monotonic() - started, 3),
        }
        return value

    async def arun(self, name: str, func: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            value = await func()
        except BaseException as exc:  # noqa: BLE001
            self.results[name] = {
                "ok": False,
                "detail": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
                "seconds": round(time.monotonic() - started, 3),
            }
            return None
        self.results[name] = {
            "ok": True,
            "detail": "" if value is None else str(value)[:2000],
            "seconds": round(time.monotonic() - started, 3),
        }
        return value

    def finish(self) -> None:
        payload = {"steps": self.results, **self.extra}
        sys.stdout.flush()
        print("RESULT " + json.dumps(payload, default=str), flush=True)
        sys.exit(0 if all(r["ok"] for r in self.results.values()) else 1)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
