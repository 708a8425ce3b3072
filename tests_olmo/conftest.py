"""tests_olmo runs in OLMo-core's own environment; it shares tests/dist_workers.py (the
two-rank spawn harness) with the main suite."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
