#!/usr/bin/env bash
# Update the locked development environment on purpose, and show what changed.
#
#   bash scripts/lock.sh                    # re-resolve; keep every pin that still fits
#   bash scripts/lock.sh --upgrade          # move every package to its newest allowed release
#   bash scripts/lock.sh --upgrade-package torch   # move one package (repeatable)
#
# The ranges live in requirements-*.in; the locks (exact versions with hashes,
# what CI installs) in requirements-*.txt, resolved for CI's platform: CPython
# 3.11 on x86_64 Linux. Afterwards the script prints each version that moved.
# Then run the tests on the new lock, and regenerate the committed real-run
# fixtures only if the physics checks ask for it:
#   CI=true bash .ci/run
#   ADAPTERPROBE_REALRUNS=fresh .venv/bin/python -m pytest tests/test_corpus.py tests/test_field_corpus.py
#   .venv/bin/python tools/realruns/fixtures.py --check
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install -q --require-hashes -r requirements-uv.txt
fi

for name in dev olmo; do
  lock="requirements-$name.txt"
  before=$(mktemp)
  if [ -f "$lock" ]; then cp "$lock" "$before"; fi
  uv pip compile "requirements-$name.in" -o "$lock" --quiet --generate-hashes \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command "bash scripts/lock.sh" "$@"
  echo "== $lock: versions that moved (old -> new)"
  python3 scripts/pin_changes.py "$before" "$lock"
  rm -f "$before"
done
