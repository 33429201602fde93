#!/usr/bin/env bash
# Builds build/sandbox-agent-dir/sandbox-agent/: the agent as an unpacked folder (PyInstaller
# --onedir), the form the local gVisor runtime binds read-only into a sandbox at
# /opt/sandbox-agent. Nothing is unpacked at start: the interpreter and the agent (standard
# library only) are read from the bound folder, so the sandbox's in-memory /tmp stays empty and
# checkpoints do not carry a copy of the agent (the static single-file build, build-static.sh, unpacks about
# 42 MB into /tmp at every start; it stays for images where only one file can ride in).
#
# The folder holds `sandbox-agent` (the entry) and `_internal/` (libpython, extension modules,
# the standard library). It links against the image's glibc: it needs glibc >= the build
# machine's (2.36 on Debian bookworm, which the default rootfs is); use the static build for
# other images.
#
# Idempotent and cached: the result is reused while the agent sources, this script and the
# pinned tool versions are unchanged. Output path on stdout (last line). Build-only packages go
# into build/sandbox-agent-dir/venv, never into the project's environment.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYINSTALLER_VERSION=6.22.3
OUT=build/sandbox-agent-dir
DIST=$OUT/sandbox-agent
VENV=$OUT/venv

die() { echo "build-unpacked: $*" >&2; exit 1; }
[ -x /usr/bin/python3 ] || die "Debian's /usr/bin/python3 is required (apt-get install python3)"

VERSIONS="pyinstaller=$PYINSTALLER_VERSION"
KEY=$( (cat agent/sandbox_agent/*.py agent/build/entry.py "$0";
        echo "$VERSIONS";
        /usr/bin/python3 -c 'import sys; print(sys.version)';
        uname -m) | sha256sum | cut -c1-32)

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9  # one build at a time; a second caller then finds the first one's result

if [ -x "$DIST/sandbox-agent" ] && [ "$(cat "$OUT/.key" 2>/dev/null)" = "$KEY" ]; then
  echo "build-unpacked: up to date" >&2
  echo "$DIST"
  exit 0
fi

rm -f "$OUT/.key"
if [ ! -x "$VENV/bin/pyinstaller" ] || [ "$(cat "$OUT/venv.versions" 2>/dev/null)" != "$VERSIONS" ]; then
  echo "build-unpacked: creating the build venv (Debian python3)" >&2
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-warn-script-location \
    "pyinstaller==$PYINSTALLER_VERSION" 2>&1 \
    | grep -v "is ignored" >&2 || true
  "$VENV/bin/python" -c "import PyInstaller" || die "installing the build tools failed"
  echo "$VERSIONS" > "$OUT/venv.versions"
fi

WORK=$OUT/work
rm -rf "$WORK"
mkdir -p "$WORK"
echo "build-unpacked: pyinstaller --onedir" >&2
# ssl is left out: the agent serves plain HTTP and never opens TLS connections.
"$VENV/bin/pyinstaller" --onedir --noconfirm --log-level WARN --name sandbox-agent \
  --paths agent --hidden-import sandbox_agent.app \
  --exclude-module tkinter --exclude-module unittest --exclude-module pydoc \
  --exclude-module ssl --exclude-module _ssl \
  --distpath "$WORK/dist" --workpath "$WORK/pyi" --specpath "$WORK" \
  agent/build/entry.py
"$WORK/dist/sandbox-agent/sandbox-agent" --version >/dev/null || die "the build does not run"
rm -rf "$DIST"
mv "$WORK/dist/sandbox-agent" "$DIST"
rm -rf "$WORK"
echo "$KEY" > "$OUT/.key"
echo "build-unpacked: built $DIST/ ($(du -sh "$DIST" | cut -f1))" >&2
echo "$DIST"
