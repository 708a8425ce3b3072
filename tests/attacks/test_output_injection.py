"""Hostile names and file contents through every output format.

The CLI runs as a subprocess with a strict UTF-8 stdout (``PYTHONIOENCODING=
utf-8``, so a name that is not UTF-8 would crash a writer that forgot it), on
a pipe and under a pseudo-terminal; the HTML report is loaded in headless
Chromium. No format may carry a raw control byte, a raw HTML tag, a forged
line or a traceback; JSON keeps every name round-trippable.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import browser
import pytest
import xmlschema

from attacks.hostile_names import BAD_UTF8, NAMES, RAW_CONTROLS, RAW_MARKUP, hostile_root

SCHEMA = Path(__file__).parent.parent / "schemas" / "junit.xsd"
OUR_COLOURS = re.compile(r"\x1b\[(?:1;35|1;31|33|2|32|0)m")
HEAD = re.compile(r"^(PASS|WARN|FAIL|SKIP|ERROR)\s")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return hostile_root(tmp_path_factory.mktemp("attacks") / "root")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "FORCE_COLOR")}
    full.update({"PYTHONIOENCODING": "utf-8", **(env or {})})
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args],
        capture_output=True,
        env=full,
        timeout=300,
    )
    stderr = done.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    assert done.returncode in (0, 1), stderr
    return done


def assert_no_raw_payload(text: str, where: str, markup: bool = False) -> None:
    for payload in RAW_CONTROLS + (RAW_MARKUP if markup else ()):
        assert payload not in text, f"raw {payload!r} in {where}"


def test_json_keeps_every_name_round_trippable(root):
    done = run("scan", str(root), "--json")
    records = json.loads(done.stdout)
    stores = {r["store"] for r in records}
    for name in NAMES:
        path = os.path.join(str(root), name)
        assert path in stores, name
        assert os.path.isdir(os.fsencode(path))
    assert any(BAD_UTF8 in s for s in stores)
    # JSON Lines: the same records
    lines = run("scan", str(root), "--format", "jsonl").stdout.decode().splitlines()
    assert [json.loads(line) for line in lines] == records


def test_table_on_a_pipe_is_inert(root):
    out = run("scan", str(root)).stdout.decode("utf-8")
    assert_no_raw_payload(out, "the table")
    records = json.loads(run("scan", str(root), "--json").stdout)
    skips_folded = sum(
        r["verdict"] == "skip"
        and any(o["store"] == r["store"] and o["verdict"] != "skip" for o in records)
        for r in records
    )
    heads = [line for line in out.splitlines() if HEAD.match(line)]
    per_store = len({r["store"] for r in records})
    # one head line per shown record and per store: no line forged by a name
    assert len(heads) == len(records) - skips_folded + per_store
    assert not any(h.startswith("PASS   training_drift  totally-fine") for h in heads)
    assert "\\x1b[1A" in out and "\\xff" in out  # shown, visibly


def test_table_under_a_terminal_has_only_our_colours(root):
    import pty
    import select

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "GITHUB_ACTIONS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterprobe", "scan", str(root)],
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(slave)
    data = b""
    while select.select([master], [], [], 120)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    os.close(master)
    assert proc.wait(timeout=60) in (0, 1)
    text = data.decode("utf-8", "replace")
    assert OUR_COLOURS.search(text)
    assert_no_raw_payload(OUR_COLOURS.sub("", text), "the terminal table")


def test_markdown_carries_no_markup_from_names(root):
    out = run("scan", str(root), "--format", "markdown", "--only", "warn,fail,error,pass")
    text = out.stdout.decode("utf-8")
    assert_no_raw_payload(text, "markdown", markup=True)
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert all(line.count(" | ") == 4 for line in rows[2:]), "a name split a table row"


def test_csv_cells_are_guarded(root):
    text = run("scan", str(root), "--format", "csv").stdout.decode("utf-8")
    assert_no_raw_payload(text, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows
    for row in rows:
        for key in ("store", "adapter", "message", "layout", "probe"):
            assert not row[key].startswith(("=", "+", "-", "@")), (key, row[key])
    assert any("=HYPERLINK" in row["store"] for row in rows)
    from adapterprobe.escape import csv_cell

    for formula in ("=1+1", "+1", "-1+2", "@SUM(A1)"):
        assert csv_cell(formula) == "'" + formula
    assert not csv_cell("\t=1").startswith(("\t", "="))  # the tab is shown as text
    assert csv_cell("plain") == "plain" and csv_cell("a\x1bb") == "a\\x1bb"


def test_github_annotations_cannot_be_forged(root, tmp_path):
    summary = tmp_path / "summary.md"
    done = run("scan", str(root), "--format", "github", env={"GITHUB_STEP_SUMMARY": str(summary)})
    text = done.stdout.decode("utf-8")
    assert_no_raw_payload(text, "github output")
    records = json.loads(run("scan", str(root), "--json").stdout)
    # the runner trims a line before looking for ::, so indented lines count
    commands = [line for line in text.splitlines() if line.lstrip().startswith("::")]
    assert len(commands) == sum(r["verdict"] in ("warn", "fail", "error") for r in records)
    for line in commands:
        assert re.match(r"^::(error|warning) file=[^,:]*,title=[^:,]*::", line), line
    # the legacy parser obeys ##[...] anywhere, on stdout and stderr alike
    assert "##[" not in text and "##[" not in done.stderr.decode("utf-8")
    assert_no_raw_payload(summary.read_text(encoding="utf-8"), "the step summary", markup=True)


def test_junit_is_valid_xml_with_hostile_names(root, tmp_path):
    target = tmp_path / "junit.xml"
    run("scan", str(root), "-q", "--junit", str(target))
    raw = target.read_bytes().decode("utf-8")
    assert "\x1b" not in raw and "\x07" not in raw and "<img" not in raw
    xmlschema.XMLSchema(SCHEMA).validate(str(target))


def test_html_report_runs_nothing_in_a_browser(root, tmp_path):
    page = tmp_path / "report.html"
    run("report", str(root), "-o", str(page))
    text = page.read_text(encoding="utf-8")
    assert "<img src=x" not in text and "<script>alert" not in text
    with browser.Browser(browser.find_browser()) as b:
        result = b.load(page, screenshot=False)
    assert result.dialogs == [] and result.exceptions == []


@pytest.mark.parametrize("payload", ["--x\r::stop-commands::t", "--x\n::add-mask::y", "\x1b[2J"])
def test_argument_errors_show_what_was_typed_escaped(payload):
    """argparse's own errors quote the arguments: a carriage return there
    forged a GitHub workflow command line in the log."""
    for args in (["scan", payload], [payload], ["scan", "--format", payload]):
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", *args], capture_output=True, timeout=300
        )
        assert done.returncode == 2, args
        err = done.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, err
        assert "\r" not in err and "\x1b" not in err, (args, err)
        assert not any(line.startswith("::") for line in err.splitlines()), (args, err)
