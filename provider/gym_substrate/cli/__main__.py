"""`python -m gym_substrate.cli ...`: the command line without a console script on PATH.

`local up --daemon` re-executes itself this way, so the detached backend does not depend on the
`gym-substrate` script being installed where the interpreter is.
"""

from __future__ import annotations

from gym_substrate.cli import main

if __name__ == "__main__":
    main(prog_name="gym-substrate")
