"""(d) One mini-swe-agent 2 episode through Gym's mini_swe_agent_2 code: `_run_mini_swe_v2` with
its `MiniSWESandboxEnvironment` (the sync `Sandbox` facade) on our provider, mini-swe-agent's
`DefaultAgent` and litellm model driven by the scripted policy (chat completions with tool calls).

Replaced, because SWE-bench's data and images are not available offline: the SWE-bench instance
(a tiny repository of our own in /testbed, put there by `SandboxSpec.files`), and `_run_eval_v2`
(the `swebench` harness) by a grader that runs the repository's unit tests through the same
environment and reports them in swebench's shape, so Gym's `_is_resolved` decides the reward.
Gym's `/run` endpoint around it (Ray task, verify response) does not run. Details in
tests/gym/inside/mini_swe.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from gym_helpers import NOTES, REPO, TIMINGS, Backend, leak_guard, run_inside

pytestmark = [pytest.mark.gym, pytest.mark.runsc, pytest.mark.timeout(400)]


def test_mini_swe_agent_episode(gym_chroot: Path, gvisor_backend: Backend, policy: str) -> None:
    with leak_guard(gvisor_backend):
        run = run_inside(
            "mini_swe.py",
            policy,
            env={
                **gvisor_backend.env(),
                "XDG_STATE_HOME": "/tmp/gym-substrate-state",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            },
            binds=[(REPO / "configs", "/cfg")],
            timeout=360,
        )
    assert run.result is not None, run.explain()
    steps = run.result["steps"]
    for name, got in steps.items():
        trace = got.get("traceback", "")
        assert got["ok"], f"{name}: {got['detail']}\n{trace}\n{run.explain(3000)}"
    TIMINGS["mini-swe: episode (agent + grading)"] = run.result["episode_seconds"]
    TIMINGS["mini-swe: sandbox cleanup (background thread)"] = run.result["cleanup_seconds"]
    NOTES.append(
        f"mini-swe episode: reward {run.result['reward']}, exit {run.result['exit_status']}, "
        f"commands {run.result['tool_calls']}"
    )
    assert run.result["reward"] == 1.0
    assert run.result["exit_status"] == "Submitted"
    assert run.result["tool_calls"][-1].startswith("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    assert "return a + b" in run.result["model_patch"]
