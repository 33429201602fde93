"""(d) One mini-swe-agent 2 episode through Gym's mini_swe_agent_2 code and its sandbox environment.

    python mini_swe.py POLICY_BASE_URL

What runs is Gym's own `_run_mini_swe_v2` (responses_api_agents/mini_swe_agent_2/app.py): it
loads mini-swe-agent's stock swebench.yaml, builds `MiniSWESandboxEnvironment` (the sync
`nemo_gym.sandbox.Sandbox` facade, through `minisweagent.environments.get_environment`), runs
mini-swe-agent's `DefaultAgent` with its litellm model against the scripted policy, and then
grades. The config is assembled as `MiniSWEAgent.run()` does: the stock mini_swe_agent_2.yaml
`sandbox_spec` and `sandbox_environment_kwargs`, the provider block from configs/substrate.yaml
through Gym's resolver, the provider's default_metadata merged under the spec's.

Two things differ from a SWE-bench rollout, because SWE-bench's data and images are not
available offline: the task is a tiny repository of our own (calc.py with a bug, test_calc.py),
put into /testbed through `SandboxSpec.files` (so the facade uploads it), with no conda env
(`activate_conda: false`); and `_run_eval_v2`, which needs the `swebench` harness and the
instance's SWE-bench test spec, is replaced by a grader that runs the task's unit tests through
the same environment (`env.execute(..., is_eval=True)`) and reports them in swebench's report
shape, so Gym's own `_is_resolved` decides the reward. Gym's `/run` endpoint around this (Ray
task dispatch, verify response) is not exercised here.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from common import CONFIG, Steps, check, gym_config

POLICY = sys.argv[1]
INSTANCE_ID = "gym-substrate__calc-1"
IMAGE = "gym-substrate/calc:1"
CALC_MARKER = "[gym-substrate:calc]"
CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = (
    "import unittest\n\nimport calc\n\n\n"
    "class T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n\n"
    "    def test_sub(self):\n        self.assertEqual(calc.sub(5, 3), 2)\n\n\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)
FAIL_TO_PASS, PASS_TO_PASS = ["test_add"], ["test_sub"]

steps = Steps()
work = Path(tempfile.mkdtemp(prefix="gymt-mswe-"))


def build_config() -> Path:
    from nemo_gym.sandbox import resolve_provider_config, resolve_provider_metadata
    from responses_api_agents.mini_swe_agent_2 import app

    overrides = work / "overrides.yaml"
    overrides.write_text(
        yaml.safe_dump(
            {"sandbox": {"substrate": {"create": {"image_templates": {IMAGE: "local/sandbox"}}}}}
        )
    )
    agent_yaml = Path(app.__file__).parent / "configs" / "mini_swe_agent_2.yaml"
    g = gym_config(str(agent_yaml), CONFIG, str(overrides))
    from omegaconf import OmegaConf

    agent_cfg = OmegaConf.to_container(
        g["mini_swe_agent_2"]["responses_api_agents"]["mini_swe_agent_2"], resolve=True
    )
    provider = resolve_provider_config(agent_cfg["sandbox_provider"], g)
    default_metadata = resolve_provider_metadata(agent_cfg["sandbox_provider"], g)

    config = yaml.safe_load(app.get_config_path(app._swebench_config_path()).read_text())
    env_kwargs = dict(agent_cfg["sandbox_environment_kwargs"])
    env_kwargs["activate_conda"] = False  # our /testbed has no conda env
    config.setdefault("environment", {}).update(env_kwargs)
    config["environment"]["provider"] = app._sandbox_provider_for_config_dump(provider)
    spec = app._sandbox_spec_for_instance(
        agent_cfg["sandbox_spec"], resource_profiles=None, instance_id=INSTANCE_ID
    )
    if default_metadata:
        spec["metadata"] = {**default_metadata, **(spec.get("metadata") or {})}
    spec["files"] = {"/testbed/calc.py": CALC, "/testbed/test_calc.py": TESTS}
    config["environment"]["spec"] = spec
    path = work / f"{INSTANCE_ID}.sandbox.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    steps.extra["provider_options"] = spec.get("provider_options")
    return path


def grade(*, instance: dict[str, Any], env: Any, model_patch: str, **_: Any) -> dict[str, Any]:
    """Stands in for `_run_eval_v2` (swebench): the unit tests, in swebench's report shape."""
    result = env.execute("python3 -m unittest -v test_calc 2>&1", is_eval=True)
    output = result["output"]
    status = {}
    for group, names in (("FAIL_TO_PASS", FAIL_TO_PASS), ("PASS_TO_PASS", PASS_TO_PASS)):
        ok = [
            n
            for n in names
            if f"{n} (" in output
            and any(
                line.startswith(n) and line.rstrip().endswith("ok") for line in output.splitlines()
            )
        ]
        status[group] = {"success": ok, "failure": [n for n in names if n not in ok]}
    resolved = result["returncode"] == 0 and all(not s["failure"] for s in status.values())
    steps.extra["eval_output"] = output[-2000:]
    steps.extra["model_patch"] = model_patch[-2000:]
    report = {instance["instance_id"]: {"resolved": resolved, "tests_status": status}}
    return {
        "instance_id": instance["instance_id"],
        "model_patch": model_patch,
        "eval_report": report,
    }


def episode(config_path: Path) -> dict[str, Any]:
    from responses_api_agents.mini_swe_agent_2 import app

    cleaned = threading.Event()
    original_cleanup = app._cleanup_env_best_effort

    def cleanup(env: Any) -> None:
        t = time.monotonic()
        try:
            original_cleanup(env)
        finally:
            steps.extra["cleanup_seconds"] = round(time.monotonic() - t, 3)
            cleaned.set()

    app._run_eval_v2 = grade
    app._cleanup_env_best_effort = cleanup
    instance = {
        "instance_id": INSTANCE_ID,
        "image_name": IMAGE,
        "problem_statement": f"{CALC_MARKER} calc.add(2, 3) returns -1; make it return the sum.",
    }
    started = time.monotonic()
    out = app._run_mini_swe_v2(
        subset="verified",
        split="test",
        workers=1,
        output=str(work / "results"),
        model="hosted_vllm/scripted-policy",
        api_key="dummy",
        base_url=POLICY,
        env="sandbox",
        run_golden=False,
        instance_id=INSTANCE_ID,
        config=config_path,
        instance_dict=json.dumps(instance),
        responses_create_params="{}",
        step_timeout=120,
        eval_timeout=300,
        step_limit=10,
    )
    steps.extra["episode_seconds"] = round(time.monotonic() - started, 3)
    # Gym stops the sandbox on a background thread (off the rollout's critical path); this
    # process would end before it, so wait for it.
    check(cleaned.wait(120), "the environment's cleanup did not finish in 120 s")
    result = out[INSTANCE_ID]
    reward = 1.0 if app._is_resolved(INSTANCE_ID, result["eval_report"]) else 0.0
    steps.extra["reward"] = reward
    steps.extra["exit_status"] = result["exit_status"]
    steps.extra["tool_calls"] = [
        json.loads(item["arguments"])["command"]
        for item in result["response_output"]
        if item.get("type") == "function_call"
    ]
    check(result["exit_status"] == "Submitted", f"exit status {result['exit_status']!r}")
    check(reward == 1.0, f"reward {reward}; eval output: {steps.extra.get('eval_output')!r}")
    return {"reward": reward, "exit_status": result["exit_status"]}


config_path = steps.run("build_config", build_config)
steps.run("episode", lambda: episode(config_path) if config_path else 1 / 0)
steps.finish()
