"""The one error every experiment raises for bad input or a run that cannot go on.

The message always names what was wrong (the option, the file and line, the value) and how to
fix it; the CLI prints it as one line and exits 1, with no traceback.
"""

from __future__ import annotations

__all__ = ["ExperimentError"]


class ExperimentError(Exception):
    """An experiment's input is wrong or it cannot run; the message says what and what to do."""
