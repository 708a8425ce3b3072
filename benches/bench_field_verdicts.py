"""How the verdicts fare on runs that look like the field: both rule sets on the
labelled corpus of real transformers.Trainer runs (tools/realruns/field.py).

    python benches/bench_field_verdicts.py [--corpus DIR] [--rules robust sway] [--width 150]

The corpus is generated into benches/.data/field when missing (a few minutes
of single-threaded CPU training). For each rule set it prints

1. false alarms: every warn/fail/error record (any probe: training_drift,
   gradient_ghost, adapter_weights) on a healthy run, with its probe,
   verdict and message;
2. faults missed: per fault class, which runs raised no alarm at all, and
   which probes caught the others (with training_drift's verdict and message);
3. the same counts broken down by the runs' logging_steps (1, 5, 10, 50,
   500 ...), and by full fine-tune vs LoRA.

A healthy run is a false alarm when any of its records is warn, fail or
error. A faulty run is caught when any record is warn or fail: an error
(the probe could not read something) does not say the run is faulty. Each
count is given for all probes and for training_drift alone (the probe whose
rules are being redesigned); "drift skipped" counts runs training_drift
declined to judge (verdict skip, e.g. too few logged points).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import adapterprobe as ap

DATA = Path(__file__).parent / ".data"
ALARMS = {"warn", "fail", "error"}


@dataclass
class Run:
    name: str
    label: str
    logging_steps: int
    finetune: str
    alarms: list[tuple[str, str, str]] = field(default_factory=list)  # (probe, verdict, message)
    drift: tuple[str, str] = ("absent", "")  # training_drift's (verdict, message)

    @property
    def healthy(self) -> bool:
        return self.label == "healthy"

    @property
    def flagged(self) -> bool:
        """A false alarm on a healthy run: any warn, fail or error."""
        return bool(self.alarms)

    @property
    def caught(self) -> bool:
        """A faulty run shown as faulty: any warn or fail."""
        return any(verdict != "error" for _, verdict, _ in self.alarms)

    @property
    def drift_flagged(self) -> bool:
        return self.drift[0] in ALARMS

    @property
    def drift_caught(self) -> bool:
        return self.drift[0] in ("warn", "fail")


def ensure_field(path: Path | None) -> Path:
    root = path or DATA / "field"
    if not (root / "labels.json").exists():
        from realruns.field import write_field_corpus

        print(f"generating the field corpus into {root} (a few minutes of CPU training) ...")
        began = time.perf_counter()
        write_field_corpus(root, progress=True)
        print(f"generated in {time.perf_counter() - began:.0f} s")
    return root


def judged(root: Path, labels: dict[str, Any], rules: str) -> tuple[list[Run], list[Any]]:
    runs = {
        name: Run(name, info["label"], info["logging_steps"], info["finetune"])
        for name, info in labels.items()
    }
    report = ap.scan(root, rules=rules)
    for record in report:
        run = runs.get(_run_of(root, Path(record.store)))
        if run is None:
            continue
        if record.probe == "training_drift":
            run.drift = (record.verdict.value, record.message)
        if record.verdict.value in ALARMS:
            run.alarms.append((record.probe, record.verdict.value, record.message))
    return list(runs.values()), list(report.problems)


def _run_of(root: Path, store: Path) -> str:
    """The corpus run a record's store belongs to (its first path part under root)."""
    try:
        return store.resolve().relative_to(root.resolve()).parts[0]
    except (ValueError, IndexError):
        return store.name


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def report(runs: list[Run], problems: list[Any], rules: str, width: int) -> None:
    healthy = [r for r in runs if r.healthy]
    faulty = [r for r in runs if not r.healthy]
    print(f"\n=== rules={rules} ===")
    n_h, n_f = len(healthy), len(faulty)
    print(
        f"healthy runs flagged (false alarms): {sum(r.flagged for r in healthy)}/{n_h} "
        f"(training_drift: {sum(r.drift_flagged for r in healthy)}/{n_h})"
    )
    print(
        f"faulty runs missed: {sum(not r.caught for r in faulty)}/{n_f} "
        f"(training_drift: {sum(not r.drift_caught for r in faulty)}/{n_f})"
    )
    if problems:
        print(f"scan problems: {len(problems)}")
        for problem in problems:
            print(f"  {problem}")

    per_probe: dict[str, int] = defaultdict(int)
    for run in healthy:
        for probe in {probe for probe, _, _ in run.alarms}:
            per_probe[probe] += 1
    if per_probe:
        shown = ", ".join(f"{p} {n}" for p, n in sorted(per_probe.items()))
        print(f"healthy runs flagged, per probe: {shown}")

    print("\n1. false alarms on healthy runs")
    for run in healthy:
        if run.flagged:
            print(f"  {run.name}  (logging_steps={run.logging_steps}, {run.finetune})")
            for probe, verdict, message in run.alarms:
                print(f"      {probe}:{verdict}  {_clip(message, width)}")
    if not any(r.flagged for r in healthy):
        print("  none")

    print("\n2. faults per class: training_drift's verdict; other probes' warn/fail/error")
    by_class: dict[str, list[Run]] = defaultdict(list)
    for run in faulty:
        by_class[run.label].append(run)
    for label, members in sorted(by_class.items()):
        caught = sum(r.caught for r in members)
        drift = sum(r.drift_caught for r in members)
        print(f"  {label:22s} caught {caught}/{len(members)} (training_drift {drift})")
        for run in members:
            others = ", ".join(
                sorted({f"{p}:{v}" for p, v, _ in run.alarms if p != "training_drift"})
            )
            status = "" if run.caught else "  MISSED"
            print(f"      {run.name:36s} drift {run.drift[0]:5s} | {others or '-'}{status}")
            print(f"      {'':36s} {_clip(run.drift[1], width - 38)}")

    print("\n3. by logging cadence and by fine-tune kind (all probes / training_drift alone)")
    print(f"  {'group':20s} {'false alarms':>14s} {'missed':>12s} {'drift skipped':>14s}")
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[f"logging_steps={run.logging_steps}"].append(run)
    for key in sorted(groups, key=lambda k: int(k.split("=")[1])):
        _group_line(key, groups[key])
    for kind in ("lora", "full"):
        _group_line(kind, [r for r in runs if r.finetune == kind])


def _group_line(key: str, members: list[Run]) -> None:
    healthy = [r for r in members if r.healthy]
    faulty = [r for r in members if not r.healthy]
    n_h, n_f = len(healthy), len(faulty)
    alarms = f"{sum(r.flagged for r in healthy)}/{sum(r.drift_flagged for r in healthy)} of {n_h}"
    missed = (
        f"{sum(not r.caught for r in faulty)}/{sum(not r.drift_caught for r in faulty)} of {n_f}"
    )
    skipped = f"{sum(r.drift[0] == 'skip' for r in members)} of {len(members)}"
    print(f"  {key:20s} {alarms:>14s} {missed:>12s} {skipped:>14s}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--rules", nargs="+", default=["robust", "sway"])
    parser.add_argument("--width", type=int, default=150, help="clip messages to this width")
    args = parser.parse_args()
    start = time.perf_counter()
    root = ensure_field(args.corpus)
    labels = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    n_healthy = sum(v["label"] == "healthy" for v in labels.values())
    print(f"field corpus {root}: {len(labels)} runs ({n_healthy} healthy)")
    for rules in args.rules:
        runs, problems = judged(root, labels, rules)
        report(runs, problems, rules, args.width)
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
