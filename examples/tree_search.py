"""Breadth-first search over shell actions, branching sandboxes with forks instead of replaying.

The task: a safe that opens only for the right three-symbol code, entered one symbol per step
(`enter A` ... `enter D`), after an expensive setup (installing the safe; `--setup-s` stands in
for what a real environment spends installing dependencies). A search node is the sandbox after
a sequence of actions. Two ways to get there:

- forks: each node's sandbox is forked once per action (`provider.fork(handle, 4)`), so a child
  starts from its parent's exact state: setup and prefix are never run again;
- replay: each node gets a fresh sandbox that runs the setup and replays the node's whole action
  prefix before trying the action.

Both expand the same nodes in the same order (the 4 children of a node at once) and stop at the
same solution; the example prints the nodes expanded and the wall time of each.

    python examples/tree_search.py                  # a local backend (gVisor if it can run)
    python examples/tree_search.py --runtime process --setup-s 0.5
    python examples/tree_search.py --config stack.yaml   # a Substrate you already run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gym_substrate import SubstrateProvider
from gym_substrate.nemo.types import SandboxHandle, SandboxSpec

ACTIONS = ("A", "B", "C", "D")
DEPTH = 3
SAFE = "/tmp/safe"


def setup_command(combination: str, setup_s: float) -> str:
    """Install the safe: it keeps the code entered so far and knows only the right one's hash."""
    digest = hashlib.sha256(combination.encode()).hexdigest()
    check = (
        f'[ "$(sha256sum < {SAFE}/code | cut -d" " -f1)" = {digest} ] && echo OPEN || echo LOCKED'
    )
    return (
        f"mkdir -p {SAFE} && : > {SAFE}/code && printf '%s\\n' '{check}' > {SAFE}/check "
        f"&& sleep {setup_s:g}"
    )


def action_command(symbol: str) -> str:
    """Enter one symbol, then ask the safe."""
    return f"printf {symbol} >> {SAFE}/code && sh {SAFE}/check"


@dataclass
class Outcome:
    how: str
    solution: list[str] | None
    expanded: int
    seconds: float
    sandboxes: int
    replayed_steps: int = 0


async def _try(provider: SubstrateProvider, handle: SandboxHandle, symbol: str) -> bool:
    result = await provider.exec(handle, action_command(symbol), timeout_s=60)
    if result.return_code != 0:
        raise RuntimeError(f"action {symbol} failed in {handle.sandbox_id}: {result}")
    return (result.stdout or "").strip() == "OPEN"


async def search_with_forks(provider: SubstrateProvider, setup: str) -> Outcome:
    started = time.monotonic()
    root = await provider.create(SandboxSpec())
    await provider.exec(root, setup, timeout_s=600)
    frontier: list[tuple[SandboxHandle, list[str]]] = [(root, [])]
    expanded = sandboxes = 0
    try:
        for depth in range(1, DEPTH + 1):
            deeper: list[tuple[SandboxHandle, list[str]]] = []
            while frontier:
                parent, prefix = frontier.pop(0)
                children = await provider.fork(parent, len(ACTIONS))
                sandboxes += len(children)
                # the parent's state lives on in its children: close it while they work
                opened, _ = await asyncio.gather(
                    asyncio.gather(
                        *(_try(provider, c, a) for c, a in zip(children, ACTIONS, strict=True))
                    ),
                    provider.close(parent),
                )
                expanded += len(children)
                if any(opened):
                    symbol = ACTIONS[opened.index(True)]
                    leftover = [c for c, _ in frontier + deeper] + children
                    await _close_all(provider, leftover)
                    elapsed = time.monotonic() - started
                    return Outcome("forks", [*prefix, symbol], expanded, elapsed, sandboxes)
                if depth == DEPTH:  # leaves: nothing will fork them
                    await _close_all(provider, children)
                    continue
                # suspended until forked in turn, so a waiting node holds no worker
                await asyncio.gather(*(provider.pause(c) for c in children))
                deeper += [(c, [*prefix, a]) for c, a in zip(children, ACTIONS, strict=True)]
            frontier = deeper
        return Outcome("forks", None, expanded, time.monotonic() - started, sandboxes)
    except BaseException:
        await _close_all(provider, [c for c, _ in frontier])
        raise


async def search_with_replay(provider: SubstrateProvider, setup: str) -> Outcome:
    started = time.monotonic()
    frontier: list[list[str]] = [[]]
    expanded = sandboxes = replayed = 0

    async def node(prefix: list[str], symbol: str) -> bool:
        handle = await provider.create(SandboxSpec())
        try:
            await provider.exec(handle, setup, timeout_s=600)
            for earlier in prefix:
                await _try(provider, handle, earlier)
            return await _try(provider, handle, symbol)
        finally:
            await provider.close(handle)

    for _ in range(DEPTH):
        deeper: list[list[str]] = []
        for prefix in frontier:
            opened = await asyncio.gather(*(node(prefix, a) for a in ACTIONS))
            expanded += len(ACTIONS)
            sandboxes += len(ACTIONS)
            replayed += len(ACTIONS) * len(prefix)
            for symbol, is_open in zip(ACTIONS, opened, strict=True):
                if is_open:
                    return Outcome(
                        "replay",
                        [*prefix, symbol],
                        expanded,
                        time.monotonic() - started,
                        sandboxes,
                        replayed,
                    )
                deeper.append([*prefix, symbol])
        frontier = deeper
    return Outcome("replay", None, expanded, time.monotonic() - started, sandboxes, replayed)


async def _close_all(provider: SubstrateProvider, handles: list[SandboxHandle]) -> None:
    await asyncio.gather(*(provider.close(h) for h in handles), return_exceptions=True)


@contextlib.asynccontextmanager
async def provider_for(args: argparse.Namespace) -> AsyncIterator[tuple[SubstrateProvider, str]]:
    """A provider on `--config`'s Substrate, or on a local backend started for the run."""
    pause = {"pause_mode": "suspend"}  # a paused node holds no worker while it waits its turn
    if args.config:
        from gym_substrate.nemo.config_file import load_substrate_block

        async with SubstrateProvider(**{**load_substrate_block(args.config), **pause}) as p:
            yield p, args.config
        return
    from gym_substrate.local.backend import local_provider_kwargs

    async with local_provider_kwargs({}, runtime=args.runtime, workers=8) as (kwargs, backend):
        provider = SubstrateProvider(**kwargs, **pause)
        try:
            yield provider, f"local backend, {backend.runtime_name} runtime"
        finally:
            await provider.aclose()


async def run(args: argparse.Namespace) -> tuple[Outcome, Outcome]:
    setup = setup_command(args.combination, args.setup_s)
    async with provider_for(args) as (provider, where):
        print(
            f"tree search: {len(ACTIONS)} actions (enter {', '.join(ACTIONS)}), a {DEPTH}-symbol "
            f"code, setup {args.setup_s:g} s; {where}",
            flush=True,
        )
        forks = await search_with_forks(provider, setup)
        _report(forks)
        replay = await search_with_replay(provider, setup)
        _report(replay)
    if forks.seconds > 0:
        print(f"forks took {forks.seconds / replay.seconds:.2f}x the time of replay", flush=True)
    return forks, replay


def _report(o: Outcome) -> None:
    found = " ".join(f"enter-{s}" for s in o.solution) if o.solution else "no solution"
    extra = f", {o.replayed_steps} prefix steps replayed" if o.how == "replay" else ""
    print(
        f"{o.how:>6}: {found}; nodes expanded {o.expanded}; wall time {o.seconds:.2f} s "
        f"({o.sandboxes} sandboxes{extra})",
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", choices=("auto", "gvisor", "process"), default="auto")
    parser.add_argument("--config", help="YAML with a `sandbox: substrate:` block (no local run)")
    parser.add_argument("--setup-s", type=float, default=1.0, help="seconds the setup takes")
    parser.add_argument(
        "--combination", default="CAD", help=f"the code: {DEPTH} of {''.join(ACTIONS)}"
    )
    args = parser.parse_args(argv)
    code = args.combination
    if len(code) != DEPTH or any(c not in ACTIONS for c in code):
        parser.error(f"--combination must be {DEPTH} of {', '.join(ACTIONS)}, got {code!r}")
    if not 0 <= args.setup_s <= 600:
        parser.error(f"--setup-s must be 0..600 seconds, got {args.setup_s:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    forks, replay = asyncio.run(run(args))
    wanted = list(args.combination)
    return 0 if forks.solution == replay.solution == wanted else 1


if __name__ == "__main__":
    sys.exit(main())
