"""``scan --baseline`` / ``--fail-on-regression`` and ``report --from`` on
real HF Trainer runs: a rerun that trains less well, an adapter whose
lora_B was zeroed, the same run twice, and the refusals (other schema
version, other root, not a saved scan)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compare_runs import make_runs

from adapterprobe.records import SCHEMA_VERSION


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_runs(tmp_path_factory.getbasetemp())


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


def place(run: Path, root: Path) -> Path:
    """`root` holding one store, `run`, copied in as root/run."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(run, root / "run")
    return root


def save_scan(root: Path, out: Path) -> Path:
    done = cli("scan", str(root), "--format", "json")
    assert done.returncode == 0, done.stderr
    out.write_text(done.stdout, encoding="utf-8")
    return out


def gate(root: Path, baseline: Path, *extra: str) -> tuple[int, list[dict]]:
    done = cli("scan", str(root), "--format", "json", "--baseline", str(baseline), *extra)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_saved_scans_carry_schema_version_and_root(runs: Path, tmp_path: Path) -> None:
    root = place(runs / "seed0", tmp_path / "root")
    records = json.loads(save_scan(root, tmp_path / "scan.json").read_text(encoding="utf-8"))
    assert records
    assert all(r["schema_version"] == SCHEMA_VERSION and r["root"] == str(root) for r in records)
    assert all("baseline" not in r for r in records)


def test_the_same_run_twice_does_not_regress(runs: Path, tmp_path: Path) -> None:
    root = place(runs / "seed0", tmp_path / "root")
    saved = save_scan(root, tmp_path / "scan.json")
    code, records = gate(root, saved, "--fail-on-regression")
    assert code == 0
    before = {(r["probe"], r["adapter"]): r["verdict"] for r in json.loads(saved.read_text())}
    for r in records:
        assert r["baseline"] == {
            "verdict": before[(r["probe"], r["adapter"])],
            "regressed": False,
            "why": [],
        }


def test_a_rerun_that_trains_less_regresses(runs: Path, tmp_path: Path) -> None:
    # The baseline is the 10x learning rate run (lower loss, larger update);
    # the same store path now holds the run at the default learning rate.
    root = place(runs / "hilr", tmp_path / "root")
    saved = save_scan(root, tmp_path / "scan.json")
    place(runs / "seed0", root)
    code, records = gate(root, saved)
    assert code == 0  # without --fail-on-regression the gate only reports
    by_probe = {r["probe"]: r["baseline"] for r in records}
    drift = by_probe["training_drift"]
    assert drift["regressed"] and any(w.startswith("best loss rose") for w in drift["why"])
    assert any(w.startswith("final loss rose") for w in drift["why"])
    weights = by_probe["adapter_weights"]
    assert weights["regressed"] and any(w.startswith("‖ΔW‖ collapsed") for w in weights["why"])
    code, _ = gate(root, saved, "--fail-on-regression")
    assert code == 1
    # A wide enough margin forgives the loss, not the collapse.
    code, records = gate(root, saved, "--loss-margin", "10")
    assert not {r["probe"]: r for r in records}["training_drift"]["baseline"]["regressed"]


def test_a_zeroed_adapter_drops_its_verdict(runs: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    root = place(runs / "seed0", tmp_path / "root")
    saved = save_scan(root, tmp_path / "scan.json")
    for weights in root.rglob("adapter_model.safetensors"):
        tensors = load_file(weights)
        save_file({k: v * 0 if ".lora_B." in k else v for k, v in tensors.items()}, weights)
    code, records = gate(root, saved, "--fail-on-regression")
    assert code == 1
    weights = next(r for r in records if r["probe"] == "adapter_weights")
    assert weights["verdict"] != "pass"
    assert weights["baseline"]["verdict"] == "pass"
    assert f"verdict dropped pass -> {weights['verdict']}" in weights["baseline"]["why"]


def test_refusals_are_usage_errors_with_a_message(runs: Path, tmp_path: Path) -> None:
    root = place(runs / "seed0", tmp_path / "root")
    saved = save_scan(root, tmp_path / "scan.json")
    records = json.loads(saved.read_text(encoding="utf-8"))
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{**r, "schema_version": 999} for r in records]), encoding="utf-8")
    done = cli("scan", str(root), "--baseline", str(other))
    assert done.returncode == 2 and "schema_version 999" in done.stderr
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps([{k: v for k, v in r.items() if k != "schema_version"} for r in records]),
        encoding="utf-8",
    )
    done = cli("scan", str(root), "--baseline", str(old))
    assert done.returncode == 2 and "schema_version" in done.stderr
    moved = place(runs / "seed0", tmp_path / "moved")
    done = cli("scan", str(moved), "--baseline", str(saved))
    assert done.returncode == 2 and "another root" in done.stderr
    code, by_name = gate(moved, saved, "--match", "name", "--fail-on-regression")
    assert code == 0 and all(r["baseline"]["verdict"] is not None for r in by_name)
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00not json")
    done = cli("scan", str(root), "--baseline", str(garbage))
    assert done.returncode == 2 and "not a saved scan" in done.stderr
    done = cli("scan", str(root), "--fail-on-regression")
    assert done.returncode == 2 and "--baseline" in done.stderr
    assert json.loads(saved.read_text(encoding="utf-8")) == records  # never written to


def test_report_from_a_saved_scan_needs_no_files(runs: Path, tmp_path: Path) -> None:
    root = place(runs / "seed1", tmp_path / "root")
    saved = save_scan(root, tmp_path / "scan.json")
    live = tmp_path / "live.html"
    assert cli("report", str(root), "-o", str(live)).returncode == 0
    shutil.rmtree(root)  # the files are gone; the saved scan is enough
    again = tmp_path / "again.html"
    done = cli("report", "--from", str(saved), "-o", str(again))
    assert done.returncode == 0, done.stderr

    def normal(page: str) -> str:
        page = re.sub(r"<time[^>]*>[^<]*</time>", "", page)
        # A saved scan is records only: the settings table is not in it.
        page = page.replace("<p>No settings were recorded with this report.</p>", "")
        return re.sub(r'<table class="kv">.*?</table>', "", page, flags=re.S)

    assert normal(again.read_text(encoding="utf-8")) == normal(live.read_text(encoding="utf-8"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"store": "x", "probe": "p", "verdict": "pass"}]), encoding="utf-8")
    done = cli("report", "--from", str(bad), "-o", str(tmp_path / "x.html"))
    assert done.returncode == 2 and "schema_version" in done.stderr


def test_every_output_names_the_regressions_and_the_real_exit_code(
    runs: Path, tmp_path: Path
) -> None:
    # The rerun that trains less (see above): the gate fails it, and every
    # format says which store regressed and why, and the exit code it gives.
    root = place(runs / "hilr", tmp_path / "root")
    saved = save_scan(root, tmp_path / "scan.json")
    place(runs / "seed0", root)
    base = ["scan", str(root), "--baseline", str(saved), "--fail-on", "never"]
    junit = tmp_path / "junit.xml"
    table = cli(*base, "--fail-on-regression", "--junit", str(junit), cwd=root)
    assert table.returncode == 1, table.stderr
    assert "regressed against the baseline:" in table.stdout
    assert re.search(r"^training_drift +run$", table.stdout, re.M), table.stdout
    assert "best loss rose" in table.stdout
    summary = " ".join(table.stdout.split("\n\n")[-1].split())
    assert re.search(r"Exit 1: \d+ records? regressed against the baseline", summary), summary
    assert "--fail-on-regression" in table.stdout.split("\n\n")[-1]  # not split across lines
    assert 'type="regressed"' in junit.read_text(encoding="utf-8")
    markdown = cli(*base, "--fail-on-regression", "--format", "markdown")
    assert markdown.returncode == 1
    assert "Regressed against the baseline" in markdown.stdout
    assert "Exit 1:" in markdown.stdout and "best loss rose" in markdown.stdout
    github = cli(*base, "--fail-on-regression", "--format", "github")
    assert github.returncode == 1
    assert re.search(
        r"^::error .*regressed against the baseline: .*best loss rose", github.stdout, re.M
    )
    # Without the gate: exit 0, and the summary says what the option would do.
    plain = cli(*base)
    assert plain.returncode == 0
    assert "makes that exit 1" in " ".join(plain.stdout.split())


def test_the_gate_tags_fresh_records_in_place_and_copies_others(tmp_path: Path) -> None:
    from adapterprobe import scan
    from adapterprobe.comparison.baseline import Gate
    from adapterprobe.records import json_chunks

    demo = Path(__file__).parent.parent / "python" / "adapterprobe" / "demo_store"
    records = scan(str(demo)).records
    gate = Gate([str(demo)])
    copied = gate.record(records[0])
    assert copied is not records[0] and records[0].root is None
    assert copied.root == os.path.normpath(demo)
    tagged = next(gate.batches([list(records)], fresh=True))
    assert all(
        t is r and r.root == os.path.normpath(demo) for t, r in zip(tagged, records, strict=True)
    )
    # The pieces a writer joins are the record's own JSON text.
    text = "".join(json_chunks(tagged))
    assert json.loads(text) == [json.loads(r.to_json()) for r in tagged]
    assert all(d["root"] == os.path.normpath(demo) for d in json.loads(text))
