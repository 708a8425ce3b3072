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
  echo "Rust core takes a few minutes on two cores; cargo shows its progress ..." >&2
  python -m pip install -q --upgrade pip "maturin>=1.16,<2"
  rm -rf "$venv/wheels"
  # maturin directly, not through pip, so that cargo's progress shows.
  maturin build --release --locked --out "$venv/wheels"
  python -m pip install -q --force-reinstall "$venv"/wheels/adapterprobe-*.whl
  touch "$venv/.built"
fi
exec adapterprobe scan "$@"
