"""Corrupt and hostile saved scans given to ``scan --baseline`` and
``report --from``: a record that is not one of this schema is refused with a
usage error (exit 2) naming what is wrong; inside a record's evidence a
value of the wrong shape is read as absent (exit 0 or 1); never a
traceback; a valid one still reads."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.attacks import fs_attacks as fa

FIXTURE_RUNS = fa.REPO / "tests" / "fixtures" / "realruns"
#: What each evidence value (and each value one level inside it) is replaced by.
SHAPES: tuple[Any, ...] = ([1, 2], "x", True, None, {})


@pytest.fixture
def saved(demo_store, tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("saved")
    run = fa.cli("scan", demo_store, "--format", "json", cwd=out)
    records = json.loads(run.stdout)
    assert records and run.returncode == 1
    return out, records


def variants(records: list[dict]) -> dict[str, str]:
    one = records[0]

    def with_(**changes) -> str:
        return json.dumps([{**one, **changes}, *records[1:]])

    return {
        "deep nesting": "[" * 100_000 + "]" * 100_000,
        "a huge integer": "[" + "9" * 5000 + "]",
        "list schema_version": with_(schema_version=[1]),
        "string schema_version": with_(schema_version="1"),
        "boolean schema_version": with_(schema_version=True),
        "list root": with_(root=["/"]),
        "non-string adapter": with_(adapter=7),
        "non-dict evidence": with_(evidence=[1, 2]),
        "400-digit loss": with_(evidence={"head_loss": int("9" * 400)}),
        "deep evidence": with_(evidence=json.loads("{" + '"a":{' * 60 + "}" * 61)),
        "unknown verdict": with_(verdict="great"),
        "huge score": with_(score=int("9" * 40)),
        "not records": json.dumps({"records": records}),
        "not UTF-8": "[\xff]",
    }


@pytest.mark.parametrize("command", ["baseline", "report"])
def test_every_corrupt_saved_scan_is_a_usage_error(saved, demo_store, command, tmp_path):
    out, records = saved
    for name, text in variants(records).items():
        path = tmp_path / "bad.json"
        path.write_bytes(b"[\xff]" if name == "not UTF-8" else text.encode())
        if command == "baseline":
            run = fa.cli("scan", demo_store, "--baseline", path, "--format", "json", cwd=out)
        else:
            run = fa.cli("report", "--from", path, "-o", tmp_path / "r.html", cwd=out)
        assert "Traceback" not in run.stderr, (name, run.stderr[-800:])
        assert run.returncode == 2, (name, run.returncode, run.stderr[-400:])
        assert "saved scan" in run.stderr, (name, run.stderr)
    # the string "1" is named as what it is, not "has 1; reads 1"
    path = tmp_path / "bad.json"
    path.write_text(variants(records)["string schema_version"])
    run = fa.cli("report", "--from", path, "-o", tmp_path / "r.html", cwd=out)
    assert 'schema_version "1"' in run.stderr and "the integer 1" in run.stderr


def test_a_valid_saved_scan_still_reads_and_size_is_capped(saved, demo_store, tmp_path):
    out, records = saved
    path = tmp_path / "good.json"
    path.write_text(json.dumps(records))
    run = fa.cli("report", "--from", path, "-o", tmp_path / "r.html", cwd=out)
    assert run.returncode in (0, 1), run.stderr
    big = tmp_path / "big.json"
    big.write_text(json.dumps(records * 2000))  # a few MB
    assert big.stat().st_size > 2 << 20
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "report", "--from", str(big), "-o", "r2.html"],
        env={**os.environ, "ADAPTERPROBE_MAX_SAVED_SCAN_MB": "1"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "MAX_SAVED_SCAN_MB" in done.stderr, done.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_a_saved_scan_is_read_record_by_record_not_whole(saved, tmp_path):
    # A bad first record followed by 700 MB (a sparse tail of NULs): read
    # whole, the file's bytes and its text alone pass the 1.5 GB limit;
    # streamed, the first record is refused after the first megabyte.
    _, records = saved
    path = tmp_path / "huge.json"
    head = ("[" + json.dumps({**records[0], "verdict": "sideways"}) + ",").encode()
    with path.open("wb") as f:
        f.write(head)
        f.truncate(len(head) + (700 << 20))
    limit = 1536 << 20

    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "report", "--from", str(path), "-o", "r.html"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        cwd=tmp_path,
        env={**os.environ, "ADAPTERPROBE_MAX_SAVED_SCAN_MB": "1024"},
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-600:])
    assert "record 0" in done.stderr and "Traceback" not in done.stderr, done.stderr[-600:]


def test_extreme_but_valid_values_of_a_saved_scan_render():
    # Each was a traceback of ``report --from`` found by the fuzzer (the
    # saved_scan target): a name with 5,000 digits (int() refuses it), tick
    # loops over steps near the float range (an int step of 1e300 digits,
    # a loop whose float never moved), a log axis asked to place 0 and
    # decades beyond the float range, and an infinite tick label.
    from adapterprobe.reports.shaping import natural_key
    from adapterprobe.reports.svg import Scale, log_ticks, nice_ticks, num

    names = ["run" + "7" * 5000, "run10", "run9", "run007"]
    assert sorted(names, key=natural_key) == ["run007", "run9", "run10", names[0]]
    for lo, hi in [(0.0, 1.7e308), (-1.7e308, 1.7e308), (1e20, 1e20 + 4096), (0.0, 5.0)]:
        for integer in (False, True):
            ticks = nice_ticks(lo, hi, 6, integer)
            assert 1 <= len(ticks) <= 15, (lo, hi, integer, len(ticks))
            assert all(isinstance(t, float) and abs(t) < float("inf") for t in ticks)
    assert all(0 < t < float("inf") for t in log_ticks(-400.0, 400.0))
    axis = Scale(1e-3, 1e3, 0.0, 100.0, log=True)
    assert axis(0.0) == 0.0 and axis(float("inf")) == 100.0
    assert num(float("inf")) == "inf"


# ---------------------------------------------------------------------------
# Every evidence key of a real scan, in every wrong shape


@pytest.fixture(scope="module")
def key_examples() -> dict[str, dict[str, Any]]:
    """Per probe, every evidence key a scan of the demo store or of the
    committed real runs writes, with a value it wrote (a non-empty one
    where any record had one)."""
    from adapterprobe.scan import DEMO_STORE

    examples: dict[str, dict[str, Any]] = {}
    for root in (Path(DEMO_STORE), FIXTURE_RUNS / "corpus", FIXTURE_RUNS / "field"):
        run = fa.cli("scan", root, "--format", "json")
        assert run.returncode in (0, 1), run.stderr[-400:]
        for r in json.loads(run.stdout):
            seen = examples.setdefault(r["probe"], {})
            for key, value in (r.get("evidence") or {}).items():
                if seen.get(key) in (None, [], {}):
                    seen[key] = value
    assert {"training_drift", "adapter_weights", "gradient_ghost"} <= set(examples)
    return examples


def _one_level_down(value: Any) -> Iterator[tuple[str, Any, Any]]:
    """(where, what is there, a function putting a new value there) for the
    values one level inside ``value``: an object's values (the first six),
    a list's first item (a list's items are alike)."""
    if isinstance(value, dict):
        for k in list(value)[:6]:
            yield f"[{k!r}]", value[k], lambda new, k=k: {**value, k: new}
    elif isinstance(value, list) and value:
        yield "[0]", value[0], lambda new: [new, *value[1:]]


def shape_variants(evidence: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``evidence`` with one value replaced by each of :data:`SHAPES`: every
    key's value, each value one level inside it, and for a list one more
    level (a ``[step, value]`` pair's items, a finding's fields)."""
    for key, value in evidence.items():
        for shape in SHAPES:
            yield f"{key}={json.dumps(shape)}", {**evidence, key: shape}
        for where, inner, put in _one_level_down(value):
            for shape in SHAPES:
                yield f"{key}{where}={json.dumps(shape)}", {**evidence, key: put(shape)}
            if not isinstance(value, list):
                continue
            for deeper, _, put_deeper in _one_level_down(inner):
                for shape in SHAPES:
                    new = put(put_deeper(shape))
                    yield f"{key}{where}{deeper}={json.dumps(shape)}", {**evidence, key: new}
            if isinstance(inner, list) and len(inner) > 1:  # a pair's value
                for shape in SHAPES:
                    new = put([inner[0], shape, *inner[2:]])
                    yield f"{key}{where}[1]={json.dumps(shape)}", {**evidence, key: new}


def run_in_process(*argv: str | Path) -> tuple[int, str]:
    """``adapterprobe ARGV`` in this process (a thousand runs of a
    subprocess would take minutes): the exit code and stderr; an exception
    that escapes is the traceback the command line would have printed."""
    from adapterprobe.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    except BaseException:  # any escape is the bug looked for
        return -1, "Traceback\n" + traceback.format_exc()
    return code, err.getvalue()


def test_every_evidence_key_in_every_wrong_shape_reads_as_absent(
    saved, demo_store, key_examples, tmp_path
):
    # Each variant is a real record whose evidence holds every key its probe
    # writes (the record's own values, the others from the real runs), one
    # of them in a wrong shape. ``scan --baseline``: the variants sit in the
    # records the scan's records match (one per record per file);
    # ``report --from``: each variant is a store of its own, 150 to a page
    # (every one of them drawn with its charts).
    _, records = saved
    slots: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        slots.setdefault(r["probe"], []).append(i)
    variants: list[tuple[str, int, dict[str, Any]]] = []
    for probe, where in slots.items():
        template = records[where[0]]
        own = {k: v for k, v in template["evidence"].items() if v not in ([], {})}
        full = {**key_examples[probe], **own}  # empty lists: the real runs' items
        for name, evidence in shape_variants(full):
            variants.append((f"{probe}: {name}", where[0], evidence))
    keys = sum(len(examples) for examples in key_examples.values())
    assert keys > 60 and len(variants) > len(SHAPES) * keys

    baseline_files: list[list[dict[str, Any]]] = []
    for probe, where in slots.items():
        mine = [v for v in variants if records[v[1]]["probe"] == probe]
        for k in range(0, len(mine), len(where)):
            while len(baseline_files) <= k // len(where):
                baseline_files.append([dict(r) for r in records])
            for slot, (_, _, evidence) in zip(where, mine[k : k + len(where)], strict=False):
                baseline_files[k // len(where)][slot]["evidence"] = evidence
    path = tmp_path / "saved.json"
    for i, file_records in enumerate(baseline_files):
        path.write_text(json.dumps(file_records))
        code, err = run_in_process("scan", demo_store, "--baseline", path, "--format", "json")
        assert "Traceback" not in err and code in (0, 1), (i, code, err[-1500:])

    for start in range(0, len(variants), 150):
        page = []
        for j, (_, slot, evidence) in enumerate(variants[start : start + 150]):
            r = records[slot]
            page.append({**r, "store": f"{r['store']}/v{start + j}", "evidence": evidence})
        path.write_text(json.dumps(page))
        code, err = run_in_process("report", "--from", path, "-o", tmp_path / "r.html")
        assert "Traceback" not in err and code in (0, 1), (start, code, err[-1500:])


def test_wrong_shapes_the_baseline_reads_give_no_traceback(saved, demo_store, tmp_path):
    # Each was a traceback of ``scan --baseline``: ``rank_used`` read as an
    # object and ``eval_loss_sampled`` iterated, whatever they held.
    out, records = saved
    for probe, key, shape in [
        ("adapter_weights", "rank_used", [1, 2]),
        ("adapter_weights", "rank_used", "x"),
        ("adapter_weights", "rank_used", True),
        ("training_drift", "eval_loss_sampled", True),
    ]:
        bad = [
            {**r, "evidence": {**r["evidence"], key: shape}} if r["probe"] == probe else r
            for r in records
        ]
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        run = fa.cli("scan", demo_store, "--baseline", path, "--format", "json", cwd=out)
        assert "Traceback" not in run.stderr, (key, shape, run.stderr[-800:])
        assert run.returncode in (0, 1), (key, shape, run.returncode, run.stderr[-400:])
        judged = [r["baseline"] for r in json.loads(run.stdout) if r["probe"] == probe]
        # the value is absent: its check says nothing, the others still run
        assert judged and all(not b["regressed"] for b in judged), judged
