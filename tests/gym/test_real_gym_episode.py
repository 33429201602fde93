"""(c) One full episode through NeMo Gym 0.7.0's own servers, sandboxes on our provider.

`gym env start` runs the head server, Gym's `terminal_bench_2_1` resources server, its
`terminus_2_sandboxed_agent` (Harbor's Terminus 2 in a tmux session inside the sandbox), the
legacy environment server Gym generates for the agent, and `openai_model` pointed at our scripted
policy (policy.py) on 127.0.0.1. Then `gym eval run --no-serve` collects one rollout.

What happens, all in Gym's code: the resources server's `seed_session` starts the task sandbox
(`AsyncSandbox.start_with_setup`: the bullseye-snapshot script and `apt-get update`, which fails
offline and is only printed), the agent reattaches by id alone (`AsyncSandbox.connect({"sandbox_id":
...})`), starts tmux and types what the policy says, `verify` uploads the task's tests to /tests,
runs them and downloads /logs/verifier/reward.txt, then both sides stop the sandbox.

The task is our own, the one `arm --driver gym` ships (experiments/data/gym/hello): the stock
Terminal-Bench 2.1 tasks need their Docker images and task folders
(benchmarks/terminal_bench_2_1/..., fetched by `gym eval prepare`), which are not available
offline and would not run on the local backend's template anyway. It checks that the agent's
shell sees EXECD_API_GRACE_SHUTDOWN, which terminal_bench_2_1's stock sandbox_config sets at
create time: reward 1.0 needs the env to survive the agent's reattach by id.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from gym_helpers import (
    NOTES,
    REPO,
    TIMINGS,
    Backend,
    leak_guard,
    policy_log,
    run_argv,
)
from policy_scripts import HELLO_MARKER

from gym_substrate.lab.experiments.gym import default_task, load_task

pytestmark = [pytest.mark.gym, pytest.mark.runsc, pytest.mark.timeout(900)]

SITE = "/opt/gym/lib/python3.13/site-packages"
AGENT = "terminus_2_sandboxed_agent"
RESOURCES = "terminal_bench_2_1_resources_server"
# the folder as the run's chroot sees it (bound below): Gym's verifier uploads its tests/
INSIDE_TASK = "/hello-task"
TASK = {**load_task(default_task()), "task_folder": INSIDE_TASK}
# Servers `gym env start` launches, as <type>/<implementation> (their venvs are /opt/gym).
SERVER_DIRS = [
    "resources_servers/terminal_bench_2_1",
    "responses_api_agents/terminus_2_sandboxed_agent",
    "responses_api_models/openai_model",
    "environment_servers/legacy_agent",
]
CONFIGS = [
    f"{SITE}/resources_servers/terminal_bench_2_1/configs/terminal_bench_2_1.yaml",
    f"{SITE}/responses_api_agents/terminus_2_sandboxed_agent/configs/terminus_2_sandboxed_agent.yaml",
    f"{SITE}/responses_api_models/openai_model/configs/openai_model.yaml",
    "/cfg/substrate.yaml",
    "/w/episode.yaml",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _episode_yaml(policy: str) -> dict:
    return {
        "policy_base_url": policy,
        "policy_api_key": "dummy",
        "policy_model_name": "scripted-policy",
        # Prebuilt venvs: every server runs from /opt/gym (uv_venv_dir/<type>/<name>/.venv).
        "skip_venv_if_present": True,
        "uv_venv_dir": "/w/venvs",
        "head_server": {"host": "127.0.0.1", "port": _free_port()},
        "nemo_gym_log_dir": "/w/logs",
        AGENT: {
            "responses_api_agents": {
                AGENT: {
                    "resources_server": {"name": RESOURCES},
                    # 4 uvicorn workers importing Harbor and litellm is minutes on 2 cores.
                    "num_workers": 1,
                }
            }
        },
        # The task's image runs on the local backend's default template.
        "sandbox": {
            "substrate": {"create": {"image_templates": {TASK["docker_image"]: "local/sandbox"}}}
        },
    }


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: session id
            pids.append(int(entry.name))
    return pids


def _comm(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        cmd = "?"
    return f"{pid} {cmd[:80]}"


def _stop_session(proc: subprocess.Popen[bytes]) -> tuple[float, list[str], list[int]]:
    """SIGTERM `gym env start`, then what is left of its session, by PID (Gym's servers and Ray's
    agents outlive it otherwise). Returns (seconds, "PID cmdline" of each that needed SIGKILL,
    PIDs still there)."""
    started = time.monotonic()
    sid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    killed: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _session_pids(sid)
        if not pids:
            break
        if sig == signal.SIGKILL:
            killed = [_comm(pid) for pid in pids]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    return time.monotonic() - started, killed, _session_pids(sid)


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "servers ready! Polling" in text:
            return
        if proc.poll() is not None:
            pytest.fail(f"gym env start exited ({proc.returncode}):\n{text[-6000:]}")
        time.sleep(1)
    pytest.fail(f"Gym's servers were not ready in {timeout:.0f} s:\n{log.read_text()[-6000:]}")


def test_terminus_episode_on_terminal_bench(
    gym_chroot: Path, gvisor_backend: Backend, policy: str, tmp_path: Path
) -> None:
    work = tmp_path / "w"
    (work / "logs").mkdir(parents=True)
    for server in SERVER_DIRS:
        (work / "venvs" / server).mkdir(parents=True)
        (work / "venvs" / server / ".venv").symlink_to("/opt/gym")  # resolved inside the chroot
    (work / "tasks.jsonl").write_text(json.dumps(TASK) + "\n")
    (work / "episode.yaml").write_text(yaml.safe_dump(_episode_yaml(policy)))
    chroot_tmp = tmp_path / "chroot-tmp"  # the chroot's /tmp for this run (Ray's session files)
    chroot_tmp.mkdir()
    env = {
        **gvisor_backend.env(),
        "XDG_STATE_HOME": "/w/state",
        # litellm (imported by Harbor) otherwise fetches its model cost map from GitHub.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    binds = [
        (work, "/w"),
        (REPO / "configs", "/cfg"),
        (chroot_tmp, "/tmp"),
        (default_task(), INSIDE_TASK),
    ]
    config_args = [arg for path in CONFIGS for arg in ("--config", path)]
    start_log = work / "env-start.log"
    timings: dict[str, float] = {}

    with leak_guard(gvisor_backend):
        t0 = time.monotonic()
        with open(start_log, "wb") as out:
            server = subprocess.Popen(
                run_argv(["gym", "env", "start", *config_args], env=env, binds=binds, cwd="/w"),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_ready(server, start_log, timeout=420)
            timings["gym env start -> all servers ready"] = time.monotonic() - t0
            t1 = time.monotonic()
            collect = subprocess.run(
                run_argv(
                    [
                        "gym",
                        "eval",
                        "run",
                        "--no-serve",
                        *config_args,
                        "--agent",
                        AGENT,
                        "--input",
                        "/w/tasks.jsonl",
                        "--output",
                        "/w/rollouts.jsonl",
                        "--limit",
                        "1",
                        "--concurrency",
                        "1",
                    ],  # fmt: skip
                    env=env,
                    binds=binds,
                    cwd="/w",
                ),
                capture_output=True,
                text=True,
                timeout=400,
                check=False,
            )
            timings["gym eval run --no-serve (1 rollout)"] = time.monotonic() - t1
        finally:
            stop_seconds, killed, left = _stop_session(server)
            timings["gym env start shutdown"] = stop_seconds
    assert not left, f"processes of `gym env start` survived SIGKILL: {left}"

    logs = "\n".join(
        f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted((work / "logs").glob("*.log"))
    )
    assert collect.returncode == 0, f"{collect.stdout[-4000:]}\n{collect.stderr[-4000:]}\n{logs}"
    rollouts = [json.loads(line) for line in (work / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 1, rollouts
    rollout = rollouts[0]
    turns = [t for t in policy_log(policy) if t.get("script") == HELLO_MARKER]
    waits = sum(1 for t in turns if t.get("wait"))
    timings["terminus2_time_taken (agent, in the rollout)"] = rollout["terminus2_time_taken"]
    timings["verification_time_taken (tests + reward)"] = rollout["verification_time_taken"]
    timings["total_command_exec_time"] = rollout["total_command_exec_time"]
    timings["total_model_call_time"] = rollout["total_model_call_time"]
    summary = {
        "reward": rollout["reward"],
        "evaluation_completed": rollout.get("evaluation_completed"),
        "policy_turns": len(turns),
        "policy_wait_turns_for_the_shell_prompt": waits,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "processes_killed_at_shutdown": killed,
    }
    (tmp_path / "episode-summary.json").write_text(json.dumps(summary, indent=2))
    print("episode:", json.dumps(summary, indent=2))
    for name, seconds in timings.items():
        TIMINGS[f"episode: {name}"] = seconds
    NOTES.append(
        f"episode (terminal_bench_2_1 + terminus_2_sandboxed_agent): reward {rollout['reward']}, "
        f"{len(turns)} policy turns, {waits} of them waiting for the tmux shell's prompt, "
        f"leftover processes of `gym env start` that needed SIGKILL: {killed or 'none'}"
    )

    assert rollout.get("error") is None, rollout.get("error")
    assert rollout["terminus2_completed"], rollout
    assert rollout.get("evaluation_completed"), rollout.get("test_output")
    assert rollout["reward"] == 1.0, (
        f"test output: {rollout.get('test_output')!r}; policy turns: {turns}\n{logs}"
    )
    assert "PASS" in rollout["test_output"], rollout["test_output"]
