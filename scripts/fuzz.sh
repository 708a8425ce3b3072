#!/usr/bin/env bash
# Fuzz every adapterprobe reader for SECONDS (default 600) of wall time and
# print, per parser, the cases run, cases/s and the count of each outcome.
# Exits 1 when any case was a bug (panic, non-AdapterProbeError exception,
# crash, timeout, changed input); the cases are saved, and the last lines
# say where and how to replay them. Extra arguments go to the fuzzer, e.g.
#   bash scripts/fuzz.sh 3600 --workers 2 --seed 7 --parser ckpt
# Needs adapterprobe importable (maturin develop) and, for the seeds, torch,
# transformers, peft (lightning and tensorboard add their formats).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
[ "$#" -gt 0 ] && shift
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
exec "$python" -m tests.fuzz --seconds "$seconds" "$@"
