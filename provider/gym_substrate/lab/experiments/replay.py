"""The replay policy: an OpenAI-compatible server that answers with recorded model turns.

A run needs no model: each request is matched to a recorded rollout and turn, and answered with
that turn's output (text and tool calls) after a think time. Both dialects Gym's model servers
speak are served: the Responses API (`POST /v1/responses`) and Chat Completions
(`POST /v1/chat/completions`); `GET /v1/models` lists the recorded model names.

Matching (see `_rollouts` for the normal form): a request's first user message picks the
candidate rollouts; a candidate fits when the request starts with the rollout's recorded
opening and every model turn already in the request equals the recorded one; the number of
model turns in it is the turn to answer. Among fitting candidates the one that answered the
conversation's previous turn wins, so repeats of one task stay apart; a new conversation gets
the candidate started least often. `previous_response_id` (a response this server issued)
continues that rollout; `X-Replay-Rollout: ID` (or `metadata.replay_rollout`) pins one.
Anything that fits no rollout is a 4xx whose message says why.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._think import ThinkSpec
from gym_substrate.lab.experiments.rollouts import (
    MODEL_KINDS,
    FormatError,
    Item,
    Rollout,
    RolloutStore,
    chat_items,
    responses_items,
    split_runs,
)

__all__ = ["REPLAYER", "ReplayError", "Replayer", "Served", "create_app"]

ROLLOUT_HEADER = "X-Replay-Rollout"


class ReplayError(Exception):
    """A request the recording cannot answer: HTTP status, error code and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Served:
    """One answered request, for an experiment's per-turn figures (monotonic seconds).

    `follows` is the `key` of the answer this request continues (None on a first turn), so a
    conversation's turns chain up even when many replay the same recording at once.
    """

    rollout: str
    turn: int
    received: float
    answered: float
    think_s: float
    key: int
    follows: int | None


@dataclass(frozen=True)
class Match:
    rollout: Rollout
    turn: int
    conversation: tuple[Item, ...]  # the request without tool outputs (the sticky key)


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(items: Sequence[Item]) -> str:
    parts = []
    for item in items:
        if item[0] == "assistant":
            parts.append(f"text {_short(item[1], 40)!r}")
        elif item[0] == "call":
            parts.append(f"call {item[1]}({_short(item[2], 40)})")
    return ", ".join(parts) or "nothing"


class Replayer:
    """Matching state: which rollout answered which conversation, and what was served."""

    def __init__(
        self,
        store: RolloutStore,
        think: ThinkSpec,
        *,
        seed: int = 0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if think.kind == "recorded" and think.fallback is None and store.missing_latencies():
            raise ExperimentError(
                f"--think-s recorded: {store.missing_latencies()} turn(s) in {store.path} have "
                "no recorded latency (Gym writes it in ng_trajectory.model_calls[].duration_ms; "
                "scripts in think_s); give a fallback as --think-s recorded:SECONDS"
            )
        self.store = store
        self.think = think
        self.rng = random.Random(seed)
        self.sleep = sleep
        self.starts: Counter[str] = Counter()
        self.sticky: dict[tuple[Item, ...], str] = {}
        self.issued: dict[str, tuple[str, int, tuple[Item, ...]]] = {}
        self.served: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.thought_s = 0.0
        self.log: list[Served] = []
        self.thinking = 0  # requests inside their think time now

    # ------------------------------------------------------------------ matching

    def match(
        self, items: Sequence[Item], *, pinned: str | None = None, previous: str | None = None
    ) -> Match:
        conversation = tuple(i for i in items if i[0] != "output")
        if previous:
            entry = self.issued.get(previous)
            if entry is None:
                raise ReplayError(
                    404,
                    "unknown_previous_response",
                    f"previous_response_id {previous!r} was not issued by this replay server "
                    "(it forgets them on restart); send the whole conversation as input instead",
                )
            rollout_id, turn, before = entry
            rollout = self.store.by_id[rollout_id]
            if turn + 1 >= len(rollout.turns):
                raise self._past_end(rollout, turn + 1)
            return Match(rollout, turn + 1, before + conversation)
        if pinned is not None:
            if pinned not in self.store.by_id:
                raise ReplayError(
                    404,
                    "unknown_rollout",
                    f"{ROLLOUT_HEADER} {pinned!r}: no rollout with that id in {self.store.path} "
                    f"(ids: {', '.join(list(self.store.by_id)[:5])}"
                    f"{', ...' if len(self.store.by_id) > 5 else ''})",
                )
            candidates = [self.store.by_id[pinned]]
        else:
            candidates = self.store.candidates(items)
        if not candidates:
            known = sorted({r.key for r in self.store.rollouts})
            first = next((i[2] for i in items if i[0] == "message" and i[1] == "user"), "")
            raise ReplayError(
                404,
                "unknown_conversation",
                f"no recorded rollout starts with the user message {_short(first)!r}; "
                f"{self.store.path} has {len(self.store.rollouts)} rollout(s) whose first user "
                f"messages are: {'; '.join(repr(_short(k, 40)) for k in known[:3])}"
                f"{'; ...' if len(known) > 3 else ''}",
            )
        fitting: list[tuple[Rollout, int]] = []
        reasons: list[ReplayError] = []
        for rollout in candidates:
            opening = rollout.opening(items)
            if opening is None:
                reasons.append(
                    ReplayError(
                        404,
                        "unknown_conversation",
                        f"the conversation does not start as rollout {rollout.rollout_id} "
                        f"({rollout.source}) does: its opening messages differ",
                    )
                )
                continue
            runs = split_runs(items[opening:])
            diverged = next(
                (
                    n
                    for n, run in enumerate(runs[: len(rollout.turns)])
                    if run != rollout.turns[n].items
                ),
                None,
            )
            if diverged is not None:
                reasons.append(
                    ReplayError(
                        409,
                        "conversation_diverged",
                        f"the conversation left rollout {rollout.rollout_id} at turn "
                        f"{diverged + 1}: recorded {_describe(rollout.turns[diverged].items)}, "
                        f"got {_describe(runs[diverged])}",
                    )
                )
                continue
            if len(runs) >= len(rollout.turns):
                reasons.append(self._past_end(rollout, len(runs)))
                continue
            fitting.append((rollout, len(runs)))
        if not fitting:
            past = [r for r in reasons if r.code == "past_end"]
            diverged_ = [r for r in reasons if r.code == "conversation_diverged"]
            raise (past or diverged_ or reasons)[0]
        sticky = self.sticky.get(conversation)
        chosen = next((f for f in fitting if f[0].rollout_id == sticky), None)
        if chosen is None:
            chosen = min(fitting, key=lambda f: (self.starts[f[0].rollout_id], f[1]))
        return Match(chosen[0], chosen[1], conversation)

    @staticmethod
    def _past_end(rollout: Rollout, turn: int) -> ReplayError:
        return ReplayError(
            409,
            "past_end",
            f"rollout {rollout.rollout_id} ({rollout.source}) has {len(rollout.turns)} recorded "
            f"turn(s); this request would be turn {turn + 1}, so the agent went on after the "
            "recording ended",
        )

    async def answer(self, match: Match, received: float | None = None) -> tuple[str, Any]:
        """Think, remember the turn, return (response id, the turn)."""
        received = time.monotonic() if received is None else received
        turn = match.rollout.turns[match.turn]
        think = self.think.sample(self.rng, turn.latency_s)
        self.thought_s += think
        if think > 0:
            self.thinking += 1
            try:
                await self.sleep(think)
            finally:
                self.thinking -= 1
        if match.turn == 0:
            self.starts[match.rollout.rollout_id] += 1
        after = match.conversation + turn.items
        self.sticky[after] = match.rollout.rollout_id
        response_id = uuid.uuid4().hex
        self.issued[response_id] = (match.rollout.rollout_id, match.turn, after)
        self.served[match.rollout.rollout_id] += 1
        before = list(match.conversation)
        while before and before[-1][0] not in MODEL_KINDS:
            before.pop()
        self.log.append(
            Served(
                match.rollout.rollout_id,
                match.turn,
                received,
                time.monotonic(),
                think,
                hash(after),
                hash(tuple(before)) if match.turn > 0 and before else None,
            )
        )
        return response_id, turn

    def stats(self) -> dict[str, Any]:
        return {
            "rollouts": len(self.store.rollouts),
            "turns_recorded": sum(len(r.turns) for r in self.store.rollouts),
            "turns_served": sum(self.served.values()),
            "conversations_started": sum(self.starts.values()),
            "errors": dict(self.errors),
            "think_s_total": self.thought_s,
            "served_by_rollout": dict(self.served),
        }


# ---------------------------------------------------------------------------------- bodies


def _output_items(turn: Any, rid: str) -> list[dict[str, Any]]:
    if turn.output is not None:
        return [dict(item) for item in turn.output]
    items: list[dict[str, Any]] = []
    if turn.text:
        items.append(
            {
                "type": "message",
                "id": f"msg_{rid}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
            }
        )
    for n, call in enumerate(turn.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{rid}_{n}",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def responses_body(match: Match, rid: str, turn: Any) -> dict[str, Any]:
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": time.time(),
        "model": match.rollout.model,
        "status": "completed",
        "output": _output_items(turn, rid),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {"replay_rollout": match.rollout.rollout_id, "replay_turn": str(match.turn)},
        "temperature": None,
        "top_p": None,
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }


def chat_body(match: Match, rid: str, turn: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in turn.tool_calls
        ]
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": match.rollout.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


# ---------------------------------------------------------------------------------- app


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        },
        status=status,
    )


async def _body(request: web.Request) -> Mapping[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise ReplayError(400, "invalid_json", f"the request body is not JSON: {exc}") from exc
    if not isinstance(body, Mapping):
        raise ReplayError(400, "invalid_request", "the request body must be a JSON object")
    if body.get("stream"):
        raise ReplayError(
            400,
            "stream_unsupported",
            "the replay policy does not stream; send the request with stream: false",
        )
    return body


def _pinned(request: web.Request, body: Mapping[str, Any]) -> str | None:
    if ROLLOUT_HEADER in request.headers:
        return request.headers[ROLLOUT_HEADER]
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("replay_rollout"), str):
        return str(metadata["replay_rollout"])
    return None


REPLAYER = web.AppKey("replayer", Replayer)


def create_app(
    store: RolloutStore,
    think: ThinkSpec,
    *,
    seed: int = 0,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> web.Application:
    """The replay policy's aiohttp application (its `Replayer` is `app[REPLAYER]`)."""
    replayer = Replayer(store, think, seed=seed, sleep=sleep)
    app = web.Application()
    app[REPLAYER] = replayer

    async def handle(
        request: web.Request,
        parse: Callable[[Mapping[str, Any]], tuple[list[Item], str | None]],
        build: Callable[[Match, str, Any], dict[str, Any]],
    ) -> web.Response:
        received = time.monotonic()
        try:
            body = await _body(request)
            try:
                items, previous = parse(body)
            except FormatError as exc:
                raise ReplayError(400, "invalid_request", str(exc)) from exc
            match = replayer.match(items, pinned=_pinned(request, body), previous=previous)
            rid, turn = await replayer.answer(match, received)
        except ReplayError as exc:
            replayer.errors[exc.code] += 1
            return _error(exc.status, exc.code, exc.message)
        return web.json_response(build(match, rid, turn))

    def parse_responses(body: Mapping[str, Any]) -> tuple[list[Item], str | None]:
        if "input" not in body:
            raise FormatError("a Responses API request needs `input`")
        previous = body.get("previous_response_id")
        prev = str(previous).removeprefix("resp_") if previous else None
        return responses_items(body["input"], body.get("instructions")), prev

    def parse_chat(body: Mapping[str, Any]) -> tuple[list[Item], str | None]:
        if "messages" not in body:
            raise FormatError("a Chat Completions request needs `messages`")
        return chat_items(body["messages"]), None

    async def responses(request: web.Request) -> web.Response:
        return await handle(request, parse_responses, responses_body)

    async def chat(request: web.Request) -> web.Response:
        return await handle(request, parse_chat, chat_body)

    def model_entry(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "gym-substrate-replay"}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [model_entry(m) for m in store.models]})

    async def model(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in store.models:
            return _error(
                404,
                "model_not_found",
                f"model {name!r} is not in the recording; recorded: {', '.join(store.models)}",
            )
        return web.json_response(model_entry(name))

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(replayer.stats())

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/responses", responses)
        app.router.add_post(f"{prefix}/chat/completions", chat)
        app.router.add_get(f"{prefix}/models", models)
        app.router.add_get(f"{prefix}/models/{{name:.+}}", model)
    app.router.add_get("/replay/stats", stats)
    app.router.add_get("/healthz", healthz)
    return app
