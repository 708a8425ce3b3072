"""A short fuzz run of every reader in CI, and proof that the harness catches bugs.

The run is bounded by ADAPTERPROBE_FUZZ_SECONDS (default 20 s of fuzzing,
plus building the seeds once). Any panic, non-AdapterProbeError exception,
crash, timeout or changed input fails the test and names the saved case,
which ``python -m tests.fuzz --replay DIR`` runs again.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from .cli import fuzz, main
from .engine import Fuzzer, replay
from .targets import TARGETS, Target


def test_readers_survive_a_short_fuzz(tmp_path: Path) -> None:
    for module in ("torch", "safetensors", "transformers", "peft"):
        pytest.importorskip(module)
    from .seeds import ensure_seeds

    seconds = float(os.environ.get("ADAPTERPROBE_FUZZ_SECONDS", "20"))
    seed = int(os.environ.get("ADAPTERPROBE_FUZZ_SEED", random.randrange(1 << 31)))
    seeds = ensure_seeds()
    out = tmp_path / "bugs"
    # A generous per-case limit: CI machines are shared, and a real hang still hits it.
    stats = fuzz(list(TARGETS.values()), seeds, seconds=seconds, seed=seed, out=out, timeout=20)
    assert sum(s.cases for s in stats.values()) > 0
    # The newer readers are in every CI run, not only the oldest ones.
    for name in (
        "tfevents",
        "trainer_state",
        "trainer_log",
        "wandb_log",
        "mlflow_db",
        "csv",
        "optimizer_pt",
        "ckpt",
        "adapter_bin",
        "compare_updates",
        "compare_config",
        "saved_scan",
        "wandb_run",
        "mlflow_run",
    ):
        assert name in stats and stats[name].cases > 0, (name, sorted(stats))
    bugs = {name: s.bugs for name, s in stats.items() if s.bugs}
    details = [
        json.loads(case.read_text()) for case in sorted(out.rglob("case.json"))
    ]  # shown on failure
    assert not bugs, (bugs, f"seed {seed}", details[:3])


FAKE_CASES = 4


def _fake(call: str) -> Target:
    return Target(f"fake_{call}", f".fakes:{call}", "input.bin", "fake", ("generic",))


@pytest.fixture
def fake_seeds(tmp_path: Path) -> dict[str, list[Path]]:
    seed = tmp_path / "seed.bin"
    seed.write_bytes(bytes(range(1, 64)))
    return {"fake": [seed]}


@pytest.mark.parametrize(
    ("call", "expected", "cases"),
    [
        ("type_error_on_odd", "other-exception", 40),
        ("sleep_forever", "timeout", 2),
        ("allocate_forever", "crash", 2),
        ("abort", "crash", 2),
        ("write_input", "changed-input", 2),
        ("leave_a_file", "changed-input", 2),
        ("panic", "panic", 2),
    ],
)
def test_harness_reports_each_kind_of_bug(
    call: str, expected: str, cases: int, fake_seeds: dict[str, list[Path]], tmp_path: Path
) -> None:
    target = _fake(call)
    out = tmp_path / "out"
    timeout = 1.0 if expected == "timeout" else 15.0
    limits = {"timeout": timeout, "memory": 1 << 30}
    fuzzer = Fuzzer(target, fake_seeds, seed=1, workdir=tmp_path / "work", out=out, **limits)
    stats = fuzzer.run(max_cases=cases)
    assert stats.outcomes[expected] >= 1, stats.outcomes
    assert set(stats.outcomes) <= {expected, "error"}, stats.outcomes
    saved = sorted(out.rglob("case.json"))
    assert saved, "bug cases are saved"
    info = json.loads(saved[0].read_text())
    assert info["outcome"] == expected
    if expected == "other-exception":
        assert info["exception"] == "builtins.TypeError"
        assert "TypeError" in info["traceback"]
    # The saved case reproduces.
    (_, _, result), *_ = replay(saved[:1], {}, **limits)
    assert result.outcome == expected


def test_a_correct_parser_gives_no_bug(fake_seeds: dict[str, list[Path]], tmp_path: Path) -> None:
    fuzzer = Fuzzer(_fake("fine"), fake_seeds, seed=1, workdir=tmp_path / "w", out=tmp_path / "o")
    stats = fuzzer.run(max_cases=20)
    assert stats.outcomes == {"ok": 20}
    assert not (tmp_path / "o").exists()


def test_replay_cli_exits_1_while_a_saved_case_is_still_a_bug(
    fake_seeds: dict[str, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    fuzzer = Fuzzer(_fake("type_error_on_odd"), fake_seeds, seed=1, workdir=tmp_path / "w", out=out)
    assert fuzzer.run(max_cases=20).bugs
    assert main(["--replay", str(out)]) == 1
    assert "now other-exception" in capsys.readouterr().out
