# shellcheck shell=bash
# Shared by the .ci scripts (sourced, not run).

# Progress and fatal errors on stderr, tagged with the script's name: "[build-tools] ...".
log() { printf '[%s] %s\n' "${LOG_TAG:-$(basename "$0")}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The Debian archive this machine's apt already uses: scripts that add a suite (backports, trixie,
# forky) point it at the same mirror instead of naming one.
debian_mirror() {
  local uri
  uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' \
    /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
      /etc/apt/sources.list | head -n1)
  fi
  [ -n "$uri" ] || { echo "no Debian mirror found in /etc/apt/sources.list*; set one up first" >&2; return 1; }
  printf '%s\n' "$uri"
}
