"""The replay policy, driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from ci_policy import missing
from openai import AsyncOpenAI

from gym_substrate.lab.experiments import ExperimentError, ThinkSpec
from gym_substrate.lab.experiments.replay import REPLAYER, create_app
from gym_substrate.lab.experiments.rollouts import load_rollouts

from .helpers import invoke

DATA = Path(__file__).parent / "data"
GYM = DATA / "gym_rollouts.jsonl"
SCRIPT = DATA / "script.jsonl"
REPO = Path(__file__).resolve().parents[2]
# Gym's own example rollouts, inside the NeMo Gym environment that `.ci/gym-env` builds
GYM_EXAMPLE_IN_CHROOT = (
    "opt/gym/lib/python3.13/site-packages/resources_servers/wordle/data/example_rollouts.jsonl"
)


def _gym_example() -> Path:
    """The example file, building the NeMo Gym environment first if this machine has none
    (on CI a build that cannot be done fails the test, as every gym test does)."""
    build = subprocess.run(
        ["bash", str(REPO / ".ci" / "gym-env"), "build"],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0 or not build.stdout.strip():
        missing(f"the NeMo Gym environment could not be built:\n{build.stderr[-2000:]}")
    example = Path(build.stdout.strip().splitlines()[-1]) / GYM_EXAMPLE_IN_CHROOT
    assert example.is_file(), f"NeMo Gym 0.7.0 no longer ships {example}"
    return example


Serve = Callable[..., Any]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a replay server on a free port; returns (client, app, slept think times)."""
    runners: list[web.AppRunner] = []
    clients: list[AsyncOpenAI] = []

    async def start(path: Path, think: str = "0") -> tuple[AsyncOpenAI, web.Application, list]:
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        app = create_app(load_rollouts(path), ThinkSpec.parse(think), sleep=sleep)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        port = runner.addresses[0][1]
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        clients.append(client)
        return client, app, slept

    yield start
    for client in clients:
        await client.close()
    for runner in runners:
        await runner.cleanup()


def _prompt() -> list[dict[str, Any]]:
    first = json.loads(GYM.read_text().splitlines()[0])
    return list(first["responses_create_params"]["input"])


async def _play(
    client: AsyncOpenAI, conversation: list[Any], turns: int | None = None
) -> tuple[list[Any], list[Any]]:
    """Drive a recorded conversation as Gym's simple agent would: (responses, conversation)."""
    responses: list[Any] = []
    while turns is None or len(responses) < turns:
        resp = await client.responses.create(model="policy_model", input=conversation)
        responses.append(resp)
        items = [item.model_dump(exclude_none=True) for item in resp.output]
        conversation = conversation + items
        calls = [i for i in items if i["type"] == "function_call"]
        if not calls:
            break
        for call in calls:  # live tool output differs from the recorded one, on purpose
            conversation.append(
                {"type": "function_call_output", "call_id": call["call_id"], "output": "live"}
            )
    return responses, conversation


async def _play_responses(client: AsyncOpenAI, conversation: list[Any]) -> list[Any]:
    return (await _play(client, conversation))[0]


async def test_responses_api_replays_gyms_rollouts_turn_by_turn(serve: Serve) -> None:
    client, app, slept = await serve(GYM, "recorded")
    models = await client.models.list()
    assert [m.id for m in models.data] == ["policy_model"]
    first = await _play_responses(client, _prompt())
    second = await _play_responses(client, _prompt())
    # Two recorded repeats of one task: each new conversation gets the one started least.
    assert {r.metadata["replay_rollout"] for r in first} == {"0-0"}
    assert {r.metadata["replay_rollout"] for r in second} == {"0-1"}
    assert [r.metadata["replay_turn"] for r in first] == ["0", "1", "2"]
    calls = [i for r in first for i in r.output if i.type == "function_call"]
    assert [json.loads(c.arguments)["command"] for c in calls] == [
        "ls proj",
        "python3 -m pytest -q proj",
    ]
    assert first[-1].output_text == "Done (rollout 0)."
    assert any(i.type == "reasoning" for i in first[0].output)  # replayed as recorded
    # think time "recorded": ng_trajectory.model_calls[].duration_ms of each turn
    assert slept == pytest.approx([0.5, 0.6, 0.7, 0.51, 0.61, 0.71])
    stats = app[REPLAYER].stats()
    assert stats["turns_served"] == 6
    assert stats["conversations_started"] == 2


async def test_previous_response_id_continues_the_rollout(serve: Serve) -> None:
    client, _, _ = await serve(GYM)
    one = await client.responses.create(model="m", input=_prompt())
    call = next(i for i in one.output if i.type == "function_call")
    two = await client.responses.create(
        model="m",
        previous_response_id=one.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "x"}],
    )
    assert two.metadata == {"replay_rollout": "0-0", "replay_turn": "1"}
    with pytest.raises(openai.NotFoundError, match="was not issued by this replay server"):
        await client.responses.create(model="m", previous_response_id="resp_nope", input="hi")


async def test_chat_completions_replay_a_script_with_tool_calls(serve: Serve) -> None:
    client, _, slept = await serve(SCRIPT, "recorded:0")
    messages: list[Any] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    contents = []
    for _ in range(3):
        completion = await client.chat.completions.create(model="replay-model", messages=messages)
        message = completion.choices[0].message
        contents.append(message.content)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
    assert contents == ["Let me look.", None, "All tests pass now."]
    assert completion.choices[0].finish_reason == "stop"
    assert slept == pytest.approx([0.2, 0.1])  # the last turn has no think_s and 0 fallback
    hello = await client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Say hello."}]
    )
    assert hello.choices[0].message.content == "Hello!"


async def test_unknown_and_diverged_conversations_are_4xx_that_say_why(serve: Serve) -> None:
    client, app, _ = await serve(GYM)
    with pytest.raises(openai.NotFoundError, match="no recorded rollout starts with the user"):
        await client.responses.create(model="m", input="What is the weather?")
    diverged = [
        *_prompt(),
        {"type": "function_call", "call_id": "c", "name": "exec", "arguments": '{"command":"rm"}'},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    with pytest.raises(openai.ConflictError, match="left rollout 0-0 at turn 1"):
        await client.responses.create(model="m", input=diverged)
    _, conversation = await _play(client, _prompt())
    conversation.append({"type": "message", "role": "user", "content": "and now?"})
    with pytest.raises(openai.ConflictError, match="has 3 recorded turn"):
        await client.responses.create(model="m", input=conversation)
    with pytest.raises(openai.BadRequestError, match="does not stream"):
        await client.responses.create(model="m", input=_prompt(), stream=True)
    with pytest.raises(openai.NotFoundError, match="no rollout with that id"):
        await client.responses.create(
            model="m", input=_prompt(), extra_headers={"X-Replay-Rollout": "9-9"}
        )
    pinned = await client.responses.create(
        model="m", input=_prompt(), extra_headers={"X-Replay-Rollout": "0-1"}
    )
    assert pinned.metadata["replay_rollout"] == "0-1"
    assert app[REPLAYER].errors["unknown_conversation"] == 1


async def test_recorded_think_time_without_latencies_needs_a_fallback(tmp_path: Path) -> None:
    no_latency = tmp_path / "r.jsonl"
    row = json.loads(GYM.read_text().splitlines()[0])
    del row["ng_trajectory"]
    no_latency.write_text(json.dumps(row) + "\n")
    with pytest.raises(ExperimentError, match=r"recorded:SECONDS"):
        create_app(load_rollouts(no_latency), ThinkSpec.parse("recorded"))
    create_app(load_rollouts(no_latency), ThinkSpec.parse("recorded:1.5"))


@pytest.mark.gym
async def test_real_nemo_gym_example_rollouts_replay(serve: Serve) -> None:
    example = await asyncio.to_thread(_gym_example)
    client, _, _ = await serve(example)
    with example.open() as fh:  # noqa: ASYNC230 - a few KB, once
        row = json.loads(fh.readline())
    turns = len(load_rollouts(example).rollouts[0].turns)
    played, _ = await _play(client, list(row["responses_create_params"]["input"]), turns)
    recorded = [i for i in row["response"]["output"] if i["type"] == "function_call"]
    replayed = [i for r in played for i in r.output if i.type == "function_call"]
    assert [c.arguments for c in replayed] == [c["arguments"] for c in recorded]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("", "holds no rollouts"),
        ('{"rollout": "a", "prompt": "p", "turns": [{"text": "t"}]}\n{oops\n', "line 2: not valid"),
        ('{"hello": 1}\n', "line 1: neither a Gym rollout"),
        ('{"prompt": "p", "turns": [{"tool_calls": [{"arguments": {}}]}]}\n', "needs a string"),
        ('{"responses_create_params": {"input": "p"}, "response": {"output": []}}\n', "no model"),
    ],
)
def test_bad_rollout_files_name_the_problem(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "rollouts.jsonl"
    if content is not None:
        path.write_text(content)
    result = invoke("replay-policy", "show", "--rollouts", str(path))
    assert result.exit_code == 1
    assert message in result.output
    assert str(path) in result.output


def test_show_lists_rollouts_and_bad_think_specs_fail() -> None:
    result = invoke("replay-policy", "show", "--rollouts", str(GYM))
    assert result.exit_code == 0
    assert "0-0" in result.output
    assert "0-1" in result.output
    bad = invoke("replay-policy", "serve", "--rollouts", str(GYM), "--think-s", "soon")
    assert bad.exit_code == 2
    assert "does not parse" in bad.output
    assert "uniform" in bad.output


def test_serve_command_answers_the_openai_client_and_reports_at_exit() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gym_substrate.cli import main; main()", "replay-policy",
         "serve", "--rollouts",
         str(SCRIPT), "--port", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        url = re.search(r"http://\S+/v1", line)
        assert url, line
        client = openai.OpenAI(base_url=url.group(0), api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Say hello."}]
        )
        assert reply.choices[0].message.content == "Hello!"
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert json.loads(out)["turns_served"] == 1


async def test_a_script_with_match_replays_prompts_that_carry_live_state(
    serve: Serve, tmp_path: Path
) -> None:
    """`match`: Terminus 2's first prompt ends with the live terminal screen, so it can never
    equal a recording; a script matching a substring of it still replays turn by turn, and the
    server's log chains each turn to the answer it follows."""
    script = tmp_path / "match.jsonl"
    turns = [{"text": '{"commands": [{"keystrokes": "ls\\n"}]}'}, {"text": "done"}]
    row = {
        "rollout": "t1",
        "match": "[task:hello]",
        "prompt": "[task:hello] Do it.",
        "turns": turns,
    }
    script.write_text(json.dumps(row) + "\n")
    client, app, _ = await serve(script)
    live = [{"role": "user", "content": "protocol...\n[task:hello] Do it.\nScreen:\nroot@x:/# "}]
    one = await client.responses.create(model="replay", input=live)
    assert one.metadata == {"replay_rollout": "t1", "replay_turn": "0"}
    conversation = [
        *live,
        {"role": "assistant", "content": one.output_text},
        {"role": "user", "content": "New Terminal Output:\nfile.txt"},
    ]
    two = await client.responses.create(model="replay", input=conversation)
    assert two.output_text == "done"
    log = app[REPLAYER].log
    assert [s.turn for s in log] == [0, 1]
    assert log[0].follows is None
    assert log[1].follows == log[0].key
    with pytest.raises(openai.NotFoundError, match="no recorded rollout starts with"):
        await client.responses.create(model="replay", input="[task:other] Do it.")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**row, "match": "[task:elsewhere]"}) + "\n")
    with pytest.raises(ExperimentError, match="does not occur in the script's first user"):
        load_rollouts(bad)
