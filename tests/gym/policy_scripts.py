"""What the scripted policy answers, per task (see policy.py for the format).

- `[gym-substrate:hello]` (terminal_bench_2_1 + terminus_2_sandboxed_agent, Responses API):
  Terminus 2's JSON protocol. Turn 0 types the solution into the tmux pane once the pane shows a
  shell prompt (as a model would: with the host root filesystem of the local template, Terminus'
  `bash --login` takes seconds to source the host's profile; until then it waits 2 s per turn);
  every later turn says `task_complete: true` (Terminus asks once more before it accepts).
- `[gym-substrate:calc]` (mini_swe_agent_2's sandbox environment, chat completions with tool
  calls, as mini-swe-agent's litellm model speaks): turn 0 fixes calc.py and runs it, turn 1
  submits with mini-swe-agent's sentinel.
"""

from __future__ import annotations

import json
from typing import Any

HELLO_MARKER = "[gym-substrate:hello]"
CALC_MARKER = "[gym-substrate:calc]"
WAIT_MARKER = "[waiting]"

HELLO_SOLUTION = (
    "mkdir -p /app && printf 'hello substrate\\n%s\\n' \"$EXECD_API_GRACE_SHUTDOWN\""
    " > /app/answer.txt && cat /app/answer.txt\n"
)


def _terminus(analysis: str, commands: list[dict[str, Any]], complete: bool) -> dict[str, str]:
    return {
        "text": json.dumps(
            {
                "analysis": analysis,
                "plan": analysis,
                "commands": commands,
                "task_complete": complete,
            }
        )
    }


SCRIPTS: list[dict[str, Any]] = [
    {
        "match": HELLO_MARKER,
        "wait_marker": WAIT_MARKER,
        "max_waits": 60,
        "wait": _terminus(
            f"{WAIT_MARKER} The shell has not shown a prompt yet.",
            [{"keystrokes": "", "duration": 2.0}],
            False,
        ),
        "turns": [
            {
                **_terminus(
                    "Write both lines into /app/answer.txt.",
                    [{"keystrokes": HELLO_SOLUTION, "duration": 1.0}],
                    False,
                ),
                # The pane's last line is a prompt (`root@host:/#`, `$`).
                "wait_for": r"[#$]\s*$",
            },
            _terminus("The file is written; the task is done.", [], True),
        ],
    },
    {
        "match": CALC_MARKER,
        "turns": [
            {
                "text": "THOUGHT: add() subtracts; fix the operator and check it.",
                "bash": [
                    "sed -i '2s/return a - b/return a + b/' calc.py"
                    " && python3 -c 'import calc; print(calc.add(2, 3))'"
                ],
            },
            {
                "text": "THOUGHT: fixed; submit.",
                "bash": ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat calc.py"],
            },
        ],
    },
]


def as_json() -> str:
    return json.dumps({"scripts": SCRIPTS}, indent=2)
