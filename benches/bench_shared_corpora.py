"""How the readers and verdicts fare on real public runs nobody here wrote:
the labelled corpora in ``../shared/corpora`` (every folder there with a
``labels.json``: public-a to public-d; see their README), scanned as a user
would scan them.

    python benches/bench_shared_corpora.py [--corpora DIR] [--rules robust sway] [--width 120]

For each rule set (``robust``, the default, against the reference ``sway``,
the seeds' rules, in the same run) and each corpus it prints:

1. stores found (any record) of those labelled, and the records per probe;
2. ``not found``: labelled stores no record names;
3. ``errors on valid files``: stores not labelled n/a with an ``error`` record
   about a file that is there (an error naming a Git LFS pointer, a file a
   clone left in LFS, is counted apart as ``errors on LFS pointers``);
4. false alarms: healthy stores with any warn, fail or error record;
5. misses: faulty stores with no warn or fail record;
6. n/a stores (Git LFS pointers, nothing to judge) that got a ``pass``;

each broken down by the store's kind (trainer, lightning, tensorboard, lfs,
...), where a ``trainer_state.json`` says it the ``logging_steps`` cadence,
and by the run's facts as ``training_drift`` read them (``run_facts``: how
the run ended, what it optimised); then every store counted in 2-6 with its label's reason and the
verdicts it got, so a reader can judge each one. Targets (issues 34 and 35):
0 not found, 0 errors on valid files, 0 false alarms, 0 misses.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import adapterprobe as ap

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPORA = ROOT.parent / "shared" / "corpora"
ALARMS = {"warn", "fail", "error"}


@dataclass
class Store:
    name: str
    kind: str
    label: str
    reason: str
    cadence: str
    records: list[tuple[str, str, str]] = field(default_factory=list)  # probe, verdict, message
    completion: str = "no curve"  # run_facts of its training_drift record
    objective: str = "no curve"

    def verdicts(self) -> set[str]:
        return {v for _, v, _ in self.records}

    @property
    def not_found(self) -> bool:
        return not self.records

    def errors(self, *, lfs: bool) -> list[str]:
        return [m for _, v, m in self.records if v == "error" and ("Git LFS pointer" in m) == lfs]

    @property
    def error_on_valid(self) -> bool:
        return self.label != "n/a" and bool(self.errors(lfs=False))

    @property
    def error_on_lfs(self) -> bool:
        return self.label != "n/a" and bool(self.errors(lfs=True))

    @property
    def false_alarm(self) -> bool:
        """A WARN or FAIL on a healthy store, or an error on one of its valid
        files. An error on a Git LFS pointer is what the labels ask for
        (the weights are not there, so they must not pass): it is counted
        on its own line, not as an alarm."""
        alarms = {v for _, v, m in self.records if v in ALARMS and "Git LFS pointer" not in m}
        return self.label == "healthy" and bool(alarms)

    @property
    def missed(self) -> bool:
        return self.label == "faulty" and not self.verdicts() & {"warn", "fail"}

    @property
    def na_passed(self) -> bool:
        return self.label == "n/a" and "pass" in self.verdicts()


def cadence_of(store: Path) -> str:
    """``logging_steps=N`` from the newest trainer_state.json under the store."""
    states = sorted(store.rglob("trainer_state.json"), key=lambda p: len(str(p)))
    for path in states:
        try:
            steps = json.loads(path.read_text(encoding="utf-8")).get("logging_steps")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(steps, int):
            return f"logging_steps={steps}"
    return "cadence unknown"


def judged(corpus: Path, rules: str) -> tuple[list[Store], float, Counter[str]]:
    labels = json.loads((corpus / "labels.json").read_text(encoding="utf-8"))
    stores = {
        name: Store(name, info["kind"], info["label"], info["reason"], cadence_of(corpus / name))
        for name, info in labels.items()
    }
    began = time.perf_counter()
    report = ap.scan(corpus, rules=rules)
    took = time.perf_counter() - began
    per_probe: Counter[str] = Counter()
    for record in report:
        per_probe[record.probe] += 1
        try:
            part = Path(record.store).resolve().relative_to(corpus.resolve()).parts[0]
        except (ValueError, IndexError):
            continue
        if part in stores:
            stores[part].records.append((record.probe, record.verdict.value, record.message))
            facts = record.evidence.get("run_facts")
            if record.probe == "training_drift" and isinstance(facts, dict):
                stores[part].completion = str(facts.get("completion", "unknown"))
                stores[part].objective = str(facts.get("objective", "unknown"))
    return list(stores.values()), took, per_probe


COUNTS = {
    "not found": lambda s: s.not_found,
    "errors on valid files": lambda s: s.error_on_valid,
    "errors on LFS pointers": lambda s: s.error_on_lfs,
    "false alarms": lambda s: s.false_alarm,
    "misses": lambda s: s.missed,
    "n/a passed": lambda s: s.na_passed,
}
OUT_OF = {
    "not found": lambda s: True,
    "errors on valid files": lambda s: s.label != "n/a",
    "errors on LFS pointers": lambda s: s.label != "n/a",
    "false alarms": lambda s: s.label == "healthy",
    "misses": lambda s: s.label == "faulty",
    "n/a passed": lambda s: s.label == "n/a",
}


def tallies(stores: list[Store]) -> dict[str, tuple[int, int]]:
    return {
        what: (sum(map(hit, stores)), sum(map(OUT_OF[what], stores)))
        for what, hit in COUNTS.items()
    }


def clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def show(
    corpus: str, stores: list[Store], took: float, per_probe: Counter[str], width: int
) -> None:
    found = sum(not s.not_found for s in stores)
    probes = ", ".join(f"{n} {p}" for p, n in sorted(per_probe.items()))
    print(f"\n--- {corpus}: {found}/{len(stores)} stores found in {took:.2f} s; records: {probes}")
    for what, (n, of) in tallies(stores).items():
        print(f"  {what:<22} {n:>3} of {of}")
    for axis in ("kind", "cadence", "completion", "objective"):
        groups: dict[str, list[Store]] = defaultdict(list)
        for s in stores:
            groups[getattr(s, axis)].append(s)
        print(f"  by {axis}:")
        for key, members in sorted(groups.items()):
            parts = [f"{what} {n}/{of}" for what, (n, of) in tallies(members).items() if of]
            print(f"    {key:<22} {len(members):>3} stores: " + ", ".join(parts))
    for what, hit in COUNTS.items():
        hits = [s for s in stores if hit(s)]
        if not hits:
            continue
        print(f"  {what}:")
        for s in hits:
            print(f"    {s.name} [{s.kind}, {s.label}] {clip(s.reason, width)}")
            for probe, verdict, message in s.records:
                if verdict != "pass" or what == "n/a passed":
                    print(f"      {probe} {verdict}: {clip(message, width)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA)
    parser.add_argument("--rules", nargs="+", default=["robust", "sway"])
    parser.add_argument("--width", type=int, default=120)
    args = parser.parse_args()
    corpora = sorted(p for p in args.corpora.iterdir() if (p / "labels.json").is_file())
    if not corpora:
        raise SystemExit(f"no labelled corpus (a folder with labels.json) in {args.corpora}")
    totals: dict[str, dict[str, tuple[int, int]]] = {}
    for rules in args.rules:
        print(f"\n=== rules={rules} ===")
        everything: list[Store] = []
        for corpus in corpora:
            stores, took, per_probe = judged(corpus, rules)
            show(corpus.name, stores, took, per_probe, args.width)
            everything += stores
        totals[rules] = tallies(everything)
    print("\n=== both corpora ===")
    for what in COUNTS:
        cells = [f"{rules} {n}/{of}" for rules, t in totals.items() for n, of in [t[what]]]
        print(f"  {what:<22} " + "   ".join(cells))
    if len(totals) > 1:
        ours, ref = args.rules[0], args.rules[1]
        for what in ("false alarms", "misses"):
            a, b = totals[ours][what][0], totals[ref][what][0]
            ratio = f"reference/ours {b / a:.2f}" if a else "ours none"
            print(f"  {what}: {ours} {a} vs reference {ref} {b} ({ratio})")


if __name__ == "__main__":
    main()
