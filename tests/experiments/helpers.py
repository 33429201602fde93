"""Helpers for the experiments' tests: run a command, check a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from gym_substrate.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str, input: str | None = None) -> Result:  # noqa: A002 - click's name
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def invoke_json(*args: str) -> tuple[int, Any]:
    """Run with --json; (exit code, parsed stdout)."""
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    out = result.stdout
    start = min((i for i in (out.find("{"), out.find("[")) if i >= 0), default=-1)
    assert start >= 0, f"no JSON in the output (exit {result.exit_code}):\n{result.output}"
    return result.exit_code, json.loads(out[start:])


def assert_png(path: Path | str) -> None:
    """A valid PNG: the signature, and matplotlib reads it back as a real image."""
    import matplotlib.image

    file = Path(path)
    assert file.read_bytes()[:8] == PNG_SIGNATURE, f"{file} is not a PNG"
    image = matplotlib.image.imread(file)
    height, width = image.shape[:2]
    assert height > 100, image.shape
    assert width > 100, image.shape
