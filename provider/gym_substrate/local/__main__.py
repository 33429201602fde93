"""`python -m gym_substrate.local ...`: the `local` command group without the top-level CLI.

`local up --daemon` re-executes itself this way, so the detached backend does not depend on a
console script being on PATH.
"""

from __future__ import annotations

from gym_substrate.cli.local import local

if __name__ == "__main__":
    local(prog_name="gym-substrate local")
