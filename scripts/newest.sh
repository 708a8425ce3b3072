#!/usr/bin/env bash
# Drift check, not a gate: test against the newest releases the ranges in
# requirements-dev.in allow, instead of the lock CI installs.
#
#   bash scripts/newest.sh            # prints the drift, builds, runs the tests
#
# First it prints each package whose newest allowed release differs from the
# lock (the drift), then builds the extension into a separate environment
# (.venv-newest) and runs the test suite there, plus the real-run generators'
# physics checks on a freshly trained corpus. Its exit code is the tests'; the
# scheduled workflow (.github/workflows/newest.yml) reports it without
# blocking anything. A failure here says what the next `bash scripts/lock.sh
# --upgrade` will have to deal with.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-newest
python3 -m venv --clear "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install -q --disable-pip-version-check --require-hashes -r requirements-uv.txt

newest=$(mktemp)
uv pip compile requirements-dev.in -o "$newest" --quiet --upgrade --no-header \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28
echo "== drift: the newest allowed releases against requirements-dev.txt"
python3 scripts/pin_changes.py requirements-dev.txt "$newest"

uv pip install --quiet -r "$newest"
rm -f "$newest"
maturin develop --release --locked --quiet --features python,object-store
status=0
python -m pytest tests -q -p no:cacheprovider || status=$?
ADAPTERPROBE_REALRUNS=fresh python -m pytest tests/test_corpus.py tests/test_field_corpus.py \
  -q -p no:cacheprovider || status=$?
echo "newest releases: tests exited $status (0 = no drift that breaks us)"
exit "$status"
