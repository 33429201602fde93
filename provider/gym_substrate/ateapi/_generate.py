"""Regenerate (or, with --check, verify) the committed ateapi stubs.

    uv run python -m gym_substrate.ateapi._generate          # rewrite the stubs
    uv run python -m gym_substrate.ateapi._generate --check  # exit 1 if they are stale

The stubs are committed so that installing gym-substrate never needs grpcio-tools; the check
(also run by tests/test_ateapi_stubs.py) keeps them in step with ateapi.proto.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
INCLUDE_ROOT = HERE.parent.parent  # provider/, so imports read `gym_substrate.ateapi...`
PROTO = HERE / "ateapi.proto"
OUTPUTS = ("ateapi_pb2.py", "ateapi_pb2.pyi", "ateapi_pb2_grpc.py")


def generate(out_root: Path) -> dict[str, bytes]:
    """Run protoc into out_root and return the generated files by name."""
    from grpc_tools import protoc  # dev dependency only

    proto_rel = PROTO.relative_to(INCLUDE_ROOT)
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{INCLUDE_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(proto_rel),
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    produced = out_root / proto_rel.parent
    return {name: (produced / name).read_bytes() for name in OUTPUTS}


def stale_files() -> list[str]:
    """Names of committed stubs that differ from what protoc generates now."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    return [
        name
        for name, data in fresh.items()
        if not (HERE / name).exists() or (HERE / name).read_bytes() != data
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale stubs")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(
                "stale ateapi stubs: " + ", ".join(stale) + "; regenerate with "
                "`uv run python -m gym_substrate.ateapi._generate`",
                file=sys.stderr,
            )
            return 1
        print("ateapi stubs are up to date")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in generate(Path(tmp)).items():
            (HERE / name).write_bytes(data)
    print(f"wrote {', '.join(OUTPUTS)} to {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
