#!/usr/bin/env bash
# The main job in one command: build adapterprobe into its own virtual
# environment (.venv-scan, which never gets torch) and run `adapterprobe scan`.
# With no arguments it scans the bundled demo store; any arguments go to
# `adapterprobe scan`, e.g.
#   bash scripts/scan.sh /data/adapters --format json
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-scan
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
stale=$(find rust python Cargo.toml Cargo.lock pyproject.toml -newer "$venv/.built" 2>/dev/null | head -1 || true)
if [ ! -f "$venv/.built" ] || [ -n "$stale" ] || ! python -c "import adapterprobe" 2>/dev/null; then
  echo "building adapterprobe into $venv (first run, or sources changed): compiling the" >&2
  echo "Rust core takes about 3 minutes on two cores, and prints nothing meanwhile ..." >&2
  python -m pip install -q --upgrade pip "maturin>=1.16,<2"
  python -m pip install -q .
  touch "$venv/.built"
fi
exec adapterprobe scan "$@"
