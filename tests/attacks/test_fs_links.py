"""Links out of the scanned root: never followed, never quoted, said in the records."""

from __future__ import annotations

import json

import pytest

from tests.attacks import fs_attacks as fa

FORMATS = ("json", "csv", "table", "markdown")


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("links")
    root = base / "root"
    root.mkdir()
    attacks = fa.all_links(root, base)
    return root, base, attacks


def _no_leak(run: fa.Run) -> None:
    assert fa.SECRET not in run.output, run.args
    assert "99999:7" not in run.output, run.args  # the outside file's first line
    assert "Traceback" not in run.stderr, run.stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_format_leaks_what_links_point_at(linked, fmt):
    root, _, _ = linked
    run = fa.cli("scan", root, "--format", fmt)
    _no_leak(run)
    assert run.returncode == 1, run.stderr  # error records gate CI
    assert "outside the scanned root" in run.stdout


def test_the_html_report_leaks_nothing(linked, tmp_path):
    root, _, _ = linked
    out = tmp_path / "report.html"
    run = fa.cli("report", root, "-o", out)
    _no_leak(run)
    page = out.read_text()
    assert fa.SECRET not in page
    assert "outside the scanned root" in page


def test_records_name_every_link_not_followed(linked):
    root, _, attacks = linked
    run = fa.cli("scan", root, "--format", "json")
    records = json.loads(run.stdout)
    # The link to / and the link to a store outside: one skip record each,
    # and nothing from the machine or the other store was scanned.
    refused = {r["store"] for r in records if r["layout"] == "outside-root"}
    assert refused == {str(attacks["slash"]), str(attacks["store"])}
    assert all(r["verdict"] == "skip" for r in records if r["layout"] == "outside-root")
    assert all(r["store"].startswith(str(root)) for r in records)
    assert not any("their-store" in r["store"] for r in records)
    # Each file-level link is an error record naming the link's path.
    text = json.dumps(records)
    for name in ("environ", "pointer", "csv", "trainer_state", "dlm_log", "optimizer", "peft"):
        store = str(attacks[name]).split("/")[len(root.parts)]
        mine = [r for r in records if r["store"] == str(root / store)]
        assert mine, name
        assert any(r["verdict"] == "error" for r in mine), (name, mine)
    assert "outside the scanned root" in text
    # A link through /proc/self/environ is refused as such.
    environ = [r for r in records if r["store"] == str(root / "tb-environ")]
    assert environ and all(r["verdict"] in ("error", "skip") for r in environ), environ


def test_a_link_to_slash_does_not_walk_the_machine(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    fa.link_to_slash(root)
    run = fa.cli("scan", root, "--format", "json")
    records = json.loads(run.stdout)
    assert [r["layout"] for r in records] == ["outside-root"], records
    assert run.returncode == 0, run.stderr  # a skip, not a failure


def test_follow_symlinks_opts_out(tmp_path):
    import adapterprobe as ap

    base = tmp_path
    root = base / "root"
    root.mkdir()
    fa.link_to_outside_store(root, base / "outside")
    kept = ap.scan(root)
    assert {r.layout for r in kept} == {"outside-root"}
    followed = ap.scan(root, follow_symlinks=True)
    assert {r.layout for r in followed} == {"dlm"}
    assert {r.verdict.value for r in followed} == {"pass"}
    run = fa.cli("scan", root, "--format", "json", "--follow-symlinks")
    assert {r["layout"] for r in json.loads(run.stdout)} == {"dlm"}


def test_links_inside_the_root_are_followed(tmp_path):
    import adapterprobe as ap

    root = tmp_path / "root"
    store = fa.dlm_store(root / "real")
    (root / "alias").symlink_to(store.parent)
    # The log is a link to a copy elsewhere in the same root.
    log = next((store / "logs").glob("train-*.jsonl"))
    keep = root / "archive"
    keep.mkdir()
    moved = keep / log.name
    log.rename(moved)
    log.symlink_to(moved)
    report = ap.scan(root)
    assert {r.verdict.value for r in report} == {"pass"}, [r.message for r in report]


def test_the_python_api_leaks_nothing(linked, monkeypatch):
    import adapterprobe as ap

    root, _, _ = linked
    monkeypatch.setenv("CI_SECRET_TOKEN", fa.SECRET)
    report = ap.scan(root)
    text = report.to_json() + report.to_csv() + report.to_markdown()
    assert fa.SECRET not in text
    assert "99999:7" not in text
