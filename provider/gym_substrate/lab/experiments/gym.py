"""`--driver gym`: an arm through real NeMo Gym 0.7.0 (issue 13 §3).

The synthetic arm calls the provider itself; this one lets Gym do everything a training run
does. `gym env start` runs Gym's own servers: the `terminal_bench_2_1` resources server, the
`terminus_2_sandboxed_agent` (Harbor's Terminus 2, typing into tmux inside the sandbox), the
environment server Gym generates for it and `openai_model`, pointed at the replay policy
(`_replay`, served here on 127.0.0.1 with the think time) instead of a model. Then
`gym eval run --no-serve --num-repeats N --concurrency N` collects N rollouts of one task at
once, which is Gym's own knob for parallel rollouts (`num_samples_in_parallel`). The sandboxes
come from our provider inside Gym's processes, configured by a `sandbox: substrate:` block
written for the run, whose `lifecycle.idle_policy` is the arm's policy.

What the arm sees from outside Gym: actors by status every second (ListActors, never waking
anyone, as the synthetic arm samples), every model call at the replay policy (so a rollout's
turns and the agent's time between them), every pause and resume the local control plane
finishes (`Target.operation_log`; not observable on a cluster), and Gym's rollout rows (reward,
errors). Gym runs in its Python 3.13 environment: `.ci/gym-env`'s chroot (`--gym-env chroot`)
or a user's own environment (`--gym-python`), found and checked by `_gym_env`. Every process
the run starts carries a marker in its environment, so teardown finds them all, Ray's daemons
included, on success, failure and Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate import AlreadyExistsError
from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._gym_env import (
    GYM_ENVS,
    MARKER,
    GymEnv,
    count_lines,
    free_port,
    gym_driver_error,
    gym_env_path,
    read_rows,
    resolve_gym_env,
    stop_processes,
)
from gym_substrate.lab.experiments._think import ThinkSpec
from gym_substrate.lab.experiments._workload import Workload
from gym_substrate.lab.experiments.arm import CRASH_POLICIES, POLICIES, ArmConfig

__all__ = [
    "DRIVERS",
    "GYM_ENVS",
    "GymArmConfig",
    "GymEnv",
    "default_recording",
    "default_task",
    "gym_driver_error",
    "gym_env_path",
    "load_task",
    "resolve_gym_env",
    "run_gym_arm",
]

DRIVERS = ("synthetic", "gym")
AGENT = "terminus_2_sandboxed_agent"
RESOURCES = "terminal_bench_2_1_resources_server"
# Servers `gym env start` launches, as <type>/<implementation>; each runs from the prebuilt
# environment (uv_venv_dir/<type>/<name>/.venv links to it, with skip_venv_if_present).
SERVER_DIRS = (
    "resources_servers/terminal_bench_2_1",
    "responses_api_agents/terminus_2_sandboxed_agent",
    "responses_api_models/openai_model",
    "environment_servers/legacy_agent",
)
SERVER_CONFIGS = (
    "resources_servers/terminal_bench_2_1/configs/terminal_bench_2_1.yaml",
    "responses_api_agents/terminus_2_sandboxed_agent/configs/terminus_2_sandboxed_agent.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
)
READY_LINE = "servers ready! Polling"
DATA = Path(__file__).resolve().parent / "data" / "gym"
# Where the run's folders appear inside the chroot.
INSIDE_WORK = "/gs/work"
INSIDE_TASK = "/gs/task"


def default_task() -> Path:
    return DATA / "hello"


def default_recording() -> Path:
    return DATA / "hello-terminus.jsonl"


# ---------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class GymArmConfig(ArmConfig):
    """An arm through Gym: the policy, N, the think time, and the task and recording it runs.

    `steps` (the agent turns after the first) and `workload` (the recorded keystrokes) come
    from the recording; build one with `GymArmConfig.create`.
    """

    task: Path = field(default_factory=default_task)
    recording: Path = field(default_factory=default_recording)
    store: Any = field(default=None, repr=False, compare=False)
    servers_timeout_s: float = 600.0
    collect_timeout_s: float = 1800.0

    @classmethod
    def create(
        cls,
        policy: str,
        rollouts: int,
        think: ThinkSpec,
        *,
        task: str | Path | None = None,
        recording: str | Path | None = None,
        name: str = "",
        idle_after_s: float = 0.1,
        seed: int = 0,
        on_crash: str | None = None,
    ) -> GymArmConfig:
        from gym_substrate.lab.experiments.rollouts import load_rollouts

        task_dir = Path(task) if task is not None else default_task()
        load_task(task_dir)
        path = Path(recording) if recording is not None else default_recording()
        store = load_rollouts(path)
        if think.kind == "recorded" and think.fallback is None and store.missing_latencies():
            raise ExperimentError(
                f"--think-s recorded: {store.missing_latencies()} turn(s) in {path} have no "
                "recorded latency; give a fallback as --think-s recorded:SECONDS"
            )
        lengths = {len(r.turns) for r in store.rollouts}
        if len(lengths) != 1 or min(lengths) < 2:
            raise ExperimentError(
                f"--replay-rollouts {path}: the Gym arm replays rollouts of one shape, with at "
                f"least 2 turns each; this file has rollouts of {sorted(lengths)} turns"
            )
        commands = tuple(
            _keystrokes(t.text) for t in store.rollouts[0].turns if _keystrokes(t.text)
        ) or (f"(recorded turns of {path.name})",)
        return cls(
            policy,
            rollouts,
            min(lengths) - 1,
            think,
            Workload(f"gym:{task_dir.name}", commands),
            name=name,
            idle_after_s=idle_after_s,
            seed=seed,
            on_crash=on_crash,
            task=task_dir,
            recording=path,
            store=store,
        )

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.policy)
        if self.policy not in POLICIES:
            raise ExperimentError(f"--policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        if self.rollouts < 1:
            raise ExperimentError(f"--rollouts must be >= 1, got {self.rollouts}")
        if not self.idle_after_s > 0:
            raise ExperimentError(f"--idle-after-s must be > 0, got {self.idle_after_s}")
        if self.on_crash is not None and self.on_crash not in CRASH_POLICIES:
            raise ExperimentError(
                f"--on-crash {self.on_crash!r}: use one of {', '.join(CRASH_POLICIES)}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": "gym",
            "policy": self.policy,
            "name": self.name,
            "rollouts": self.rollouts,
            "think": str(self.think),
            "idle_after_s": self.idle_after_s,
            "on_crash": self.on_crash,
            "seed": self.seed,
            "task": str(self.task),
            "recording": str(self.recording),
            "agent": AGENT,
            "turns": self.steps + 1,
            "workload": {"name": self.workload.name, "commands": list(self.workload.commands)},
        }


def _keystrokes(text: str | None) -> str:
    """The shell input of a recorded Terminus turn (its JSON `commands`), else ""."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return ""
    commands = data.get("commands") if isinstance(data, dict) else None
    if not isinstance(commands, list):
        return ""
    return "".join(str(c.get("keystrokes") or "") for c in commands if isinstance(c, dict)).strip()


def load_task(folder: Path) -> dict[str, Any]:
    """A terminal-bench style task folder: task.json (Gym's task row) and tests/test.sh."""
    file = folder / "task.json"
    if not file.is_file() or not (folder / "tests" / "test.sh").is_file():
        raise ExperimentError(
            f"--gym-task {folder}: needs task.json (the task row: responses_create_params, "
            "task_name, docker_image) and tests/test.sh (the verifier)"
        )
    try:
        task = json.loads(file.read_text())
    except ValueError as exc:
        raise ExperimentError(f"--gym-task {file}: not valid JSON ({exc})") from exc
    if not isinstance(task, dict) or not all(
        k in task for k in ("responses_create_params", "task_name", "docker_image")
    ):
        raise ExperimentError(
            f"--gym-task {file}: needs responses_create_params, task_name and docker_image"
        )
    return task


# ---------------------------------------------------------------------------------- the arm


@dataclass
class GymProgress:
    """What the terminal shows while a Gym arm runs."""

    name: str
    stage: str  # "starting servers" | "collecting" | "stopping"
    elapsed_s: float
    rollouts_done: int
    rollouts_total: int
    statuses: dict[str, int]
    phases: dict[str, int]
    failures: int


@dataclass
class _Chain:
    """One rollout as the replay policy saw it: its answered turns in order."""

    turns: list[Any]  # _replay.Served


def _chains(log: Sequence[Any]) -> list[_Chain]:
    """Group served turns into conversations: a turn continues the chain whose last answer it
    follows (the earliest such, if several replayed identical conversations)."""
    chains: list[_Chain] = []
    for served in sorted(log, key=lambda s: s.received):
        if served.follows is None or served.turn == 0:
            chains.append(_Chain([served]))
            continue
        tail = next(
            (
                c
                for c in chains
                if c.turns[-1].key == served.follows and c.turns[-1].turn == served.turn - 1
            ),
            None,
        )
        if tail is None:
            chains.append(_Chain([served]))
        else:
            tail.turns.append(served)
    return chains


async def run_gym_arm(
    config: Any,
    target: Any,
    env: GymEnv,
    folder: Path,
    *,
    on_progress: Callable[[GymProgress], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Any:
    """Run one arm through Gym on `target`; returns an `ArmResult` (its raw records, summary)."""
    import yaml
    from aiohttp import web

    from gym_substrate.lab.experiments._instrument import Instrument, instrumented_provider
    from gym_substrate.lab.experiments._stats import mean, percentile
    from gym_substrate.lab.experiments._vocab import PHASES
    from gym_substrate.lab.experiments.arm import (
        ArmResult,
        RolloutRecord,
        Sample,
        StepRecord,
        _status_counts,
        actor_names,
        summarize,
    )
    from gym_substrate.lab.experiments.backend import merged_kwargs
    from gym_substrate.lab.experiments.replay import REPLAYER, create_app

    def say(text: str) -> None:
        if on_note is not None:
            on_note(text)

    if target.runtime == "process":
        raise ExperimentError(
            "--driver gym needs gVisor sandboxes on the local backend (the task writes to /app, "
            "/tests and /logs of its sandbox, and the process runtime gives a sandbox a "
            "read-only root but for its working folder and /tmp): "
            f"runsc is not usable here ({target.runtime_reason}); use --runtime gvisor on a host "
            "where runsc works, or --config FILE for a cluster"
        )
    work = (folder / "gym").resolve()
    for sub in ("logs", "state"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    # The chroot's /tmp (Ray's session files) must lie outside the work folder: Ray packs the
    # working directory for its workers, and a /tmp inside it packs itself until the disk fills.
    scratch = Path(tempfile.mkdtemp(prefix="gym-substrate-gym-tmp-"))
    task_dir = config.task.resolve()
    inside_work = INSIDE_WORK if env.chroot else str(work)
    inside_task = INSIDE_TASK if env.chroot else str(task_dir)
    binds = [(work, INSIDE_WORK), (task_dir, INSIDE_TASK), (scratch, "/tmp")]
    for server_dir in SERVER_DIRS:
        venv = work / "venvs" / server_dir / ".venv"
        venv.parent.mkdir(parents=True, exist_ok=True)
        if not venv.is_symlink():
            venv.symlink_to(env.prefix)  # resolved by Gym's processes, inside the chroot
    task = dict(load_task(task_dir))
    task["task_folder"] = inside_task
    (work / "tasks.jsonl").write_text(json.dumps(task) + "\n")

    store = config.store
    replay = create_app(store, config.think, seed=config.seed)
    replayer = replay[REPLAYER]
    runner = web.AppRunner(replay, access_log=None)
    await runner.setup()
    marker = uuid.uuid4().hex
    procs: list[subprocess.Popen[bytes]] = []
    atespace = target.atespace
    samples: list[Sample] = []
    outputs = [work / "rollouts.jsonl"]
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        policy_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        kwargs = merged_kwargs(
            target.provider_kwargs,
            lifecycle={
                "idle_policy": config.policy,
                "idle_after_s": config.idle_after_s,
                "ledger": f"{inside_work}/ledger.jsonl",
                **({} if config.on_crash is None else {"on_crash": config.on_crash}),
            },
        )
        create = dict(kwargs.get("create") or {})
        templates = dict(create.get("image_templates") or {})
        templates[str(task["docker_image"])] = str(create.get("template") or "local/sandbox")
        create["image_templates"] = templates
        kwargs["create"] = create
        gym_config = {
            "policy_base_url": policy_url,
            "policy_api_key": "replay",
            "policy_model_name": store.models[0],
            "skip_venv_if_present": True,
            "uv_venv_dir": f"{inside_work}/venvs",
            "head_server": {"host": "127.0.0.1", "port": free_port()},
            "nemo_gym_log_dir": f"{inside_work}/logs",
            RESOURCES: {
                "resources_servers": {
                    "terminal_bench_2_1": {
                        "sandbox_config": {
                            "env": {
                                "EXECD_API_GRACE_SHUTDOWN": "50ms",  # the stock config's
                                # A task image's root has an empty home; the local template's
                                # Debian root has root's stock dotfiles, which every login shell
                                # would run (Terminus types into `bash --login`): keep the shell
                                # as bare as in a task image.
                                "HOME": "/tmp",
                            }
                        }
                    }
                }
            },
            AGENT: {
                "responses_api_agents": {
                    AGENT: {
                        "resources_server": {"name": RESOURCES},
                        # 4 uvicorn workers importing Harbor and litellm is minutes on 2 cores.
                        "num_workers": 1,
                    }
                }
            },
            "sandbox": {
                "default_metadata": {"sandbox-api": "substrate", "experiment": config.name},
                "substrate": kwargs,
            },
        }
        (work / "gym.yaml").write_text(yaml.safe_dump(gym_config, sort_keys=False))
        config_args: list[str] = []
        for path in [*(f"{env.site}/{c}" for c in SERVER_CONFIGS), f"{inside_work}/gym.yaml"]:
            config_args += ["--config", path]
        proc_env = {
            MARKER: marker,
            "XDG_STATE_HOME": f"{inside_work}/state",
            # litellm (imported by Harbor) otherwise fetches its model cost map from GitHub.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }

        def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
            full = env.argv(argv, env=proc_env, binds=binds, cwd=inside_work)
            (work / f"{name}.cmd").write_text(" ".join(full) + "\n")
            with open(work / f"{name}.log", "wb") as out:
                proc = subprocess.Popen(
                    full,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env.process_env(proc_env),
                    cwd=str(work),
                )
            procs.append(proc)
            return proc

        def tail(name: str, size: int = 3000) -> str:
            path = work / f"{name}.log"
            text = path.read_text(errors="replace") if path.is_file() else ""
            return text[-size:]

        started = time.monotonic()
        load_start = os.getloadavg()[0]
        failures: list[str] = []
        async with instrumented_provider(kwargs, Instrument()) as provider:
            try:
                await provider.control.create_atespace(atespace)
            except AlreadyExistsError:
                pass  # an atespace from an earlier run is the one to use
            except Exception as exc:
                raise ExperimentError(f"cannot reach the control plane: {exc}") from exc
            baseline = await actor_names(provider, atespace)

            def report(stage: str, elapsed: float, statuses: dict[str, int]) -> None:
                if on_progress is None:
                    return
                phases = samples[-1].phases if samples else dict.fromkeys(PHASES, 0)
                on_progress(
                    GymProgress(
                        config.name,
                        stage,
                        elapsed,
                        count_lines(done_files()),
                        config.rollouts,
                        statuses,
                        phases,
                        len(failures) + sum(replayer.errors.values()),
                    )
                )

            def done_files() -> list[Path]:
                return [*outputs, *sorted(work.glob("rollouts*failures*.jsonl"))]

            # 1. Gym's servers.
            say(f"gym: starting Gym's servers ({env.describe}); logs in {work}")
            server = start("env-start", ["gym", "env", "start", *config_args])
            while READY_LINE not in tail("env-start", 200_000):
                if server.poll() is not None:
                    raise ExperimentError(
                        f"`gym env start` exited ({server.returncode}) before its servers were "
                        f"ready; its log ({work / 'env-start.log'}) ends:\n{tail('env-start')}"
                    )
                if time.monotonic() - started > config.servers_timeout_s:
                    raise ExperimentError(
                        f"Gym's servers were not ready in {config.servers_timeout_s:.0f} s; "
                        f"the log ({work / 'env-start.log'}) ends:\n{tail('env-start')}"
                    )
                report("starting servers", time.monotonic() - started, {})
                await asyncio.sleep(1)
            servers_s = time.monotonic() - started
            say(
                f"gym: servers ready after {servers_s:.0f} s; collecting {config.rollouts} rollouts"
            )

            # 2. The rollouts, all at once.
            with target.operation_log() as operations:
                t0 = time.monotonic()
                collect = start(
                    "eval-run",
                    [
                        "gym", "eval", "run", "--no-serve", *config_args,
                        "--agent", AGENT,
                        "--input", f"{inside_work}/tasks.jsonl",
                        "--output", f"{inside_work}/rollouts.jsonl",
                        "--limit", "1",
                        "--num-repeats", str(config.rollouts),
                        "--concurrency", str(config.rollouts),
                    ],
                )  # fmt: skip

                def phases() -> dict[str, int]:
                    counts = dict.fromkeys(PHASES, 0)
                    begun = sum(1 for s in replayer.log if s.turn == 0) + replayer.thinking
                    begun = min(begun, config.rollouts)
                    finished = min(count_lines(done_files()), config.rollouts)
                    counts["thinking"] = replayer.thinking
                    counts["creating"] = max(0, config.rollouts - begun)
                    counts["executing"] = max(0, begun - finished - replayer.thinking)
                    return counts

                async def sample_once() -> None:
                    try:
                        statuses = await _status_counts(provider, atespace, baseline)
                    except Exception:  # a lost sample is not worth failing the arm for
                        return
                    samples.append(Sample(time.monotonic() - t0, statuses, phases()))
                    report("collecting", time.monotonic() - t0, statuses)

                while collect.poll() is None:
                    await sample_once()
                    if time.monotonic() - t0 > config.collect_timeout_s:
                        failures.append("gym eval run timeout")
                        break
                    await asyncio.sleep(config.sample_interval_s)
                wall_s = time.monotonic() - t0
                await sample_once()
                op_log = list(operations) if operations is not None else None
            if collect.returncode not in (0, None):
                failures.append(f"gym eval run exit {collect.returncode}")
            say(f"gym: collection ended after {wall_s:.0f} s; stopping Gym's servers")
            report("stopping", time.monotonic() - t0, samples[-1].statuses if samples else {})
            left = await asyncio.to_thread(stop_processes, procs, marker)
            if left:
                failures.append(f"processes left after SIGKILL: {len(left)}")
            # Gym stops sandboxes on background threads; give the deletes time to land.
            deadline = time.monotonic() + 30
            while True:
                leaked = sorted(await actor_names(provider, atespace) - baseline)
                if not leaked or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            for actor_id in leaked:  # report them, but leave the next arm a clean atespace
                with contextlib.suppress(Exception):
                    await provider.delete_actor(actor_id, atespace)
    finally:
        stop_processes(procs, marker)
        await runner.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)

    # 3. What happened, as the synthetic arm's records.
    rows = read_rows(work / "rollouts.jsonl")
    failed_rows = [r for p in sorted(work.glob("rollouts*failures*.jsonl")) for r in read_rows(p)]
    for row in failed_rows:
        failures.append(f"rollout {row.get('_ng_failure_class') or 'failed'}")
    for row in rows:
        if row.get("error"):
            failures.append("rollout error")
    missing = config.rollouts - len(rows) - len(failed_rows)
    failures += ["rollout missing"] * max(0, missing)
    for code, count in replayer.errors.items():
        failures += [f"replay {code}"] * count
    chains = _chains(replayer.log)
    steps: list[StepRecord] = []
    rollouts: list[RolloutRecord] = []
    planned = len(store.rollouts[0].turns) if store.rollouts else 0
    for lane, chain in enumerate(sorted(chains, key=lambda c: c.turns[0].received)):
        rid = f"{config.name}-{lane:03d}"
        record = RolloutRecord(config.name, rid, lane, 0, chain.turns[0].received - t0, planned - 1)
        record.ended_s = chain.turns[-1].answered - t0
        for prev, served in zip(chain.turns, chain.turns[1:], strict=False):
            agent_s = served.received - prev.answered
            steps.append(
                StepRecord(
                    config.name, rid, lane, 0, served.turn - 1, prev.answered - t0,
                    served.think_s, agent_s, 0.0, 0.0, agent_s, False, None,
                )
            )  # fmt: skip
            record.steps_done += 1
        record.ok = len(chain.turns) == planned
        if not record.ok:
            record.failure = f"stopped after turn {len(chain.turns)} of {planned}"
        rollouts.append(record)
    ok_rows = [r for r in rows if not r.get("error")]
    # Rollouts done are Gym's rows without error, not the chains: a chain can end well while its
    # verification fails.
    for record in rollouts[len(ok_rows) :]:
        record.ok = False
    parks = [(s, op) for op, s in (op_log or []) if op in ("pause", "suspend")]
    result = ArmResult(
        config,
        target.describe(),
        wall_s,
        steps,
        rollouts,
        samples,
        leaked,
        parks,
        failures,
    )
    summary = summarize(result, target.slots)
    summary["reverts"] = None  # inside Gym's provider: not seen from here
    summary["rollouts_done"] = len(ok_rows)
    summary["rollouts_per_min"] = len(ok_rows) / (wall_s / 60) if wall_s > 0 else None
    summary["completion"] = len(ok_rows) / config.rollouts
    resumes = [s for op, s in (op_log or []) if op == "resume"]
    if op_log is None:
        summary.update(resumes=None, resume_p50_s=None, resume_p95_s=None)
    else:
        summary.update(
            resumes=len(resumes),
            resume_p50_s=percentile(resumes, 0.5),
            resume_p95_s=percentile(resumes, 0.95),
        )
    summary["resume_source"] = (
        "the local control plane's ResumeActor durations (worker to running)"
        if op_log is not None
        else "not observable: the provider runs inside Gym, the control plane is a cluster's"
    )
    summary["wait_p50_s"] = summary["wait_p95_s"] = None  # inside Gym's provider: not seen
    rewards = [float(r["reward"]) for r in rows if isinstance(r.get("reward"), (int, float))]
    summary.update(
        driver="gym",
        gym_env=env.describe,
        agent=AGENT,
        task=str(task.get("task_name")),
        recording=str(config.recording),
        servers_ready_s=servers_s,
        rewards=rewards,
        reward_mean=mean(rewards),
        turns_per_rollout=planned,
        replay=replayer.stats(),
        gym_timings_s={
            key: mean([float(r[key]) for r in rows if isinstance(r.get(key), (int, float))])
            for key in (
                "terminus2_time_taken",
                "verification_time_taken",
                "total_command_exec_time",
                "total_model_call_time",
            )
        },
        processes_left=len(left),
        # The host's other work shows in every figure: a busy machine is slower at everything.
        load_avg_1m=[load_start, os.getloadavg()[0]],
    )
    result.summary = summary
    (work / "replay-log.json").write_text(json.dumps([asdict(s) for s in replayer.log], indent=1))
    return result
