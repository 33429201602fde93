"""Recorded rollouts for the replay policy: Gym's rollout JSONL, or a small script format.

Gym's format is what rollout collection writes (`output_jsonl_fpath`), one rollout per line:
`responses_create_params.input` is the conversation the agent started with, `response.output`
every item the model produced (`message`, `function_call`, `reasoning`) interleaved with the
agent's `function_call_output` items, and, from NeMo Gym 0.7, `ng_trajectory.model_calls` has one
entry per model call with its `duration_ms` (the turn's recorded latency). A turn is one run of
model items between tool outputs.

The script format is for synthetic rollouts, one JSON object per line:

    {"rollout": "fix-1", "model": "replay", "system": "You are...", "prompt": "Fix the bug",
     "turns": [{"think_s": 1.5, "text": "Looking.",
                "tool_calls": [{"name": "exec", "arguments": {"command": "ls"}}]},
               {"text": "Done."}]}

`prompt` is a string (one user message) or a list of `{"role", "content"}` messages; a tool
call's `arguments` is an object or a JSON string; `call_id` is optional. `"match": TEXT` makes
a request fit the script when its first user message contains TEXT, whatever else its opening
says: for agents whose first prompt carries live state (Terminus 2 puts the terminal's screen
into it), so no recording can equal it.

Matching works on a normal form of conversations that both API dialects map to: messages by
role and text, function calls by name and canonical arguments, tool outputs as a bare marker
(their text comes from the live sandbox and differs from the recording), reasoning dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError

__all__ = [
    "MODEL_KINDS",
    "FormatError",
    "Item",
    "Rollout",
    "RolloutStore",
    "ToolCall",
    "Turn",
    "chat_items",
    "load_rollouts",
    "responses_items",
    "split_runs",
]

# A normal-form item: ("message", role, text) | ("assistant", text) | ("call", name, args) |
# ("output",). Assistant text and calls are "model items"; a run of them is one turn.
Item = tuple[str, ...]
MODEL_KINDS = ("assistant", "call")


class FormatError(ValueError):
    """A conversation or rollout line that does not have the expected shape."""


def _canonical_args(arguments: Any) -> str:
    """Arguments as canonical JSON, so re-serialised arguments still compare equal."""
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments.strip()
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                text = part.get("text")
                parts.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
        return "\n".join(p.strip() for p in parts if p.strip())
    return str(content).strip()


def responses_items(input_: Any, instructions: Any = None) -> list[Item]:
    """The normal form of a Responses API `input` (a string or a list of items)."""
    items: list[Item] = []
    if isinstance(instructions, str) and instructions.strip():
        items.append(("message", "system", instructions.strip()))
    if isinstance(input_, str):
        return [*items, ("message", "user", input_.strip())]
    if not isinstance(input_, list):
        raise FormatError("input must be a string or a list of items")
    for raw in input_:
        if not isinstance(raw, Mapping):
            raise FormatError(f"input item {raw!r} is not an object")
        kind = raw.get("type") or ("message" if "role" in raw else "")
        if kind == "message":
            role = str(raw.get("role") or "user")
            text = _text(raw.get("content"))
            if role == "assistant":
                if text:
                    items.append(("assistant", text))
            else:
                items.append(("message", "system" if role == "developer" else role, text))
        elif kind == "function_call":
            items.append(("call", str(raw.get("name")), _canonical_args(raw.get("arguments"))))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            items.append(("output",))
        # reasoning and anything else: not part of the match
    return items


def chat_items(messages: Any) -> list[Item]:
    """The normal form of Chat Completions `messages`."""
    if not isinstance(messages, list):
        raise FormatError("messages must be a list")
    items: list[Item] = []
    for raw in messages:
        if not isinstance(raw, Mapping):
            raise FormatError(f"message {raw!r} is not an object")
        role = str(raw.get("role") or "user")
        if role == "assistant":
            text = _text(raw.get("content"))
            if text:
                items.append(("assistant", text))
            for call in raw.get("tool_calls") or []:
                fn = call.get("function") or {} if isinstance(call, Mapping) else {}
                items.append(("call", str(fn.get("name")), _canonical_args(fn.get("arguments"))))
        elif role in ("tool", "function"):
            items.append(("output",))
        else:
            items.append(("message", "system" if role == "developer" else role, _text(
                raw.get("content")
            )))  # fmt: skip
    return items


def split_runs(items: Sequence[Item]) -> list[tuple[Item, ...]]:
    """Maximal runs of model items (one run per model turn) in `items`."""
    runs: list[tuple[Item, ...]] = []
    current: list[Item] = []
    for item in items:
        if item[0] in MODEL_KINDS:
            current.append(item)
        elif current:
            runs.append(tuple(current))
            current = []
    if current:
        runs.append(tuple(current))
    return runs


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # a JSON string, as both APIs carry it


@dataclass(frozen=True)
class Turn:
    """One recorded model turn: what to answer, and how long the model took."""

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    latency_s: float | None
    output: tuple[dict[str, Any], ...] | None = None  # Responses items exactly as recorded

    @property
    def items(self) -> tuple[Item, ...]:
        out: list[Item] = [("assistant", self.text.strip())] if self.text else []
        out += [("call", c.name, _canonical_args(c.arguments)) for c in self.tool_calls]
        return tuple(out)


@dataclass(frozen=True)
class Rollout:
    rollout_id: str
    model: str
    initial: tuple[Item, ...]  # the conversation before the first model turn
    turns: tuple[Turn, ...]
    source: str  # "FILE:LINE"
    contains: str | None = None  # script `match`: a substring of the first user message

    @property
    def key(self) -> str:
        """What a first request is looked up by: the first user message (else the first)."""
        return _key(self.initial)

    def opening(self, items: Sequence[Item]) -> int | None:
        """How many of `items` are the conversation's opening, or None if it is not this one's."""
        if self.contains is None:
            size = len(self.initial)
            return size if tuple(items[:size]) == self.initial else None
        size = next((n for n, item in enumerate(items) if item[0] in MODEL_KINDS), len(items))
        return size if self.contains in _key(items[:size]) else None


def _key(items: Sequence[Item]) -> str:
    for item in items:
        if item[0] == "message" and item[1] == "user":
            return " ".join(item[2].split())
    return " ".join(items[0][-1].split()) if items else ""


@dataclass
class RolloutStore:
    """Every rollout of a file, indexed by id and by first user message."""

    path: str
    rollouts: list[Rollout]
    by_id: dict[str, Rollout] = field(default_factory=dict)
    by_key: dict[str, list[Rollout]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rollout in self.rollouts:
            self.by_id[rollout.rollout_id] = rollout
            self.by_key.setdefault(rollout.key, []).append(rollout)

    @property
    def models(self) -> list[str]:
        return sorted({r.model for r in self.rollouts})

    def candidates(self, items: Sequence[Item]) -> list[Rollout]:
        key = _key(items)
        found = list(self.by_key.get(key, []))
        found += [
            r
            for r in self.rollouts
            if r.contains is not None and r.contains in key and all(r is not f for f in found)
        ]
        return found

    def missing_latencies(self) -> int:
        return sum(1 for r in self.rollouts for t in r.turns if t.latency_s is None)


# ---------------------------------------------------------------------------------- Gym format


def _turn_from_output(items: Sequence[Mapping[str, Any]], latency: float | None) -> Turn:
    texts, calls, kept = [], [], []
    for item in items:
        kept.append(dict(item))
        if item.get("type") == "message":
            text = _text(item.get("content"))
            if text:
                texts.append(text)
        elif item.get("type") == "function_call":
            calls.append(
                ToolCall(
                    str(item.get("call_id") or item.get("id") or ""),
                    str(item.get("name")),
                    item["arguments"]
                    if isinstance(item.get("arguments"), str)
                    else json.dumps(item.get("arguments") or {}),
                )
            )
    return Turn("\n".join(texts) or None, tuple(calls), latency, tuple(kept))


def _output_runs(output: Sequence[Any]) -> list[list[Mapping[str, Any]]]:
    """Split `response.output` into the items of each model turn."""
    runs: list[list[Mapping[str, Any]]] = [[]]
    for item in output:
        if not isinstance(item, Mapping):
            raise FormatError(f"response.output item {item!r} is not an object")
        kind = item.get("type")
        is_model = kind in ("function_call", "reasoning") or (
            kind == "message" and item.get("role", "assistant") == "assistant"
        )
        if is_model:
            runs[-1].append(item)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _call_items(call: Mapping[str, Any]) -> tuple[Item, ...]:
    response = call.get("response")
    if isinstance(response, Mapping) and isinstance(response.get("output"), list):
        output = [i for i in response["output"] if isinstance(i, Mapping)]
        return _turn_from_output(output, None).items
    choices = response.get("choices") if isinstance(response, Mapping) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        message = dict(choices[0].get("message") or {})
        message["role"] = "assistant"
        return tuple(chat_items([message]))
    return ()


def _latencies(row: Mapping[str, Any], turns: Sequence[Turn]) -> list[float | None]:
    """Each turn's recorded latency: the duration of the model call that produced it."""
    trajectory = row.get("ng_trajectory")
    calls = trajectory.get("model_calls") if isinstance(trajectory, Mapping) else None
    if not isinstance(calls, list):
        return [None] * len(turns)
    pool = [(c, _call_items(c)) for c in calls if isinstance(c, Mapping)]
    out: list[float | None] = []
    for turn in turns:
        found = None
        for index, (call, items) in enumerate(pool):
            if items == turn.items:
                duration = call.get("duration_ms")
                found = float(duration) / 1000 if isinstance(duration, (int, float)) else None
                del pool[index]
                break
        out.append(found)
    return out


def _gym_rollout(row: Mapping[str, Any]) -> tuple[str | None, str, list[Item], list[Turn]]:
    params = row.get("responses_create_params")
    response = row.get("response")
    if not isinstance(params, Mapping):
        raise FormatError("a Gym rollout needs `responses_create_params` (an object with `input`)")
    if not isinstance(response, Mapping) or not isinstance(response.get("output"), list):
        raise FormatError("a Gym rollout needs `response.output` (the list of output items)")
    initial = responses_items(params.get("input"), params.get("instructions"))
    turns = [_turn_from_output(run, None) for run in _output_runs(response["output"])]
    if not turns:
        raise FormatError("`response.output` holds no model output to replay")
    latencies = _latencies(row, turns)
    turns = [
        Turn(t.text, t.tool_calls, latency, t.output)
        for t, latency in zip(turns, latencies, strict=True)
    ]
    if "_ng_task_index" in row and "_ng_rollout_index" in row:
        rollout_id: str | None = f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
    else:
        trajectory = row.get("ng_trajectory")
        rid = trajectory.get("rollout_id") if isinstance(trajectory, Mapping) else None
        rollout_id = str(rid) if rid else None
    model = str(response.get("model") or params.get("model") or "replay")
    return rollout_id, model, initial, turns


# ---------------------------------------------------------------------------------- scripts


def _script_rollout(row: Mapping[str, Any]) -> tuple[str | None, str, list[Item], list[Turn]]:
    contains = row.get("match")
    if contains is not None and (not isinstance(contains, str) or not contains.strip()):
        raise FormatError("`match` must be a non-empty string (a part of the first user message)")
    prompt = row.get("prompt")
    initial: list[Item] = []
    if isinstance(row.get("system"), str):
        initial.append(("message", "system", row["system"].strip()))
    if isinstance(prompt, str):
        initial.append(("message", "user", prompt.strip()))
    elif isinstance(prompt, list):
        initial += chat_items(prompt)
    else:
        raise FormatError("a script needs `prompt`: a string or a list of {role, content}")
    if contains is not None and contains not in _key(initial):
        raise FormatError(f"`match` {contains!r} does not occur in the script's first user message")
    raw_turns = row.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise FormatError("`turns` must be a non-empty list")
    rollout_id = str(row["rollout"]) if row.get("rollout") is not None else None
    turns: list[Turn] = []
    for number, raw in enumerate(raw_turns, start=1):
        if not isinstance(raw, Mapping):
            raise FormatError(f"turn {number} is not an object")
        unknown = sorted(set(raw) - {"text", "tool_calls", "think_s"})
        if unknown:
            raise FormatError(
                f"turn {number}: unknown key(s) {', '.join(unknown)}; "
                "allowed: text, tool_calls, think_s"
            )
        text = raw.get("text")
        if text is not None and not isinstance(text, str):
            raise FormatError(f"turn {number}: `text` must be a string")
        calls = []
        for j, call in enumerate(raw.get("tool_calls") or [], start=1):
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                raise FormatError(f"turn {number}: tool call {j} needs a string `name`")
            arguments = call.get("arguments", {})
            if not isinstance(arguments, (str, Mapping)):
                raise FormatError(
                    f"turn {number}: tool call {j}: `arguments` must be an object or a string"
                )
            calls.append(
                ToolCall(
                    str(call.get("call_id") or f"call_{rollout_id or 'r'}_{number}_{j}"),
                    call["name"],
                    arguments if isinstance(arguments, str) else json.dumps(arguments),
                )
            )
        if not text and not calls:
            raise FormatError(f"turn {number}: give `text`, `tool_calls` or both")
        think = raw.get("think_s")
        if think is not None and (
            isinstance(think, bool) or not isinstance(think, (int, float)) or think < 0
        ):
            raise FormatError(f"turn {number}: `think_s` must be a number >= 0")
        turns.append(Turn(text, tuple(calls), None if think is None else float(think)))
    return rollout_id, str(row.get("model") or "replay"), initial, turns


# ---------------------------------------------------------------------------------- loading


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8") as fh:
            yield from enumerate(fh, start=1)
    except UnicodeDecodeError as exc:
        raise ExperimentError(f"--rollouts {path}: not UTF-8 text ({exc})") from exc


def load_rollouts(path: str | Path) -> RolloutStore:
    """Every rollout of a JSONL file; `ExperimentError` naming the file and line of a bad one."""
    file = Path(path)
    if not file.is_file():
        raise ExperimentError(
            f"--rollouts {file}: no such file; give the JSONL that Gym's rollout collection "
            "wrote (output_jsonl_fpath) or a replay script (see `replay-policy serve --help`)"
        )
    rollouts: list[Rollout] = []
    seen: set[str] = set()
    try:
        lines = list(_lines(file))
    except OSError as exc:
        raise ExperimentError(f"--rollouts {file}: cannot read it: {exc}") from exc
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ExperimentError(
                f"--rollouts {file} line {number}: not valid JSON ({exc})"
            ) from exc
        try:
            if not isinstance(row, Mapping):
                raise FormatError("expected a JSON object")
            if "turns" in row:
                rid, model, initial, turns = _script_rollout(row)
            elif "response" in row or "responses_create_params" in row:
                rid, model, initial, turns = _gym_rollout(row)
            else:
                raise FormatError(
                    "neither a Gym rollout (`responses_create_params` and `response`) nor a "
                    "replay script (`prompt` and `turns`)"
                )
        except FormatError as exc:
            raise ExperimentError(f"--rollouts {file} line {number}: {exc}") from exc
        rollout_id = rid or f"line-{number}"
        if rollout_id in seen:
            rollout_id = f"{rollout_id}@line-{number}"
        seen.add(rollout_id)
        contains = row.get("match") if "turns" in row else None
        rollouts.append(
            Rollout(rollout_id, model, tuple(initial), tuple(turns), where, contains or None)
        )
    if not rollouts:
        raise ExperimentError(f"--rollouts {file}: the file holds no rollouts (it is empty)")
    return RolloutStore(str(file), rollouts)
