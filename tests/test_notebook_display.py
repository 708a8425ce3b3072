"""Notebook display: ``_repr_html_`` of a scan and of one result, rendered in
headless Chromium inside a host page that stands in for a notebook (its own
styles, which the fragment must leave alone), with JavaScript off as some
notebook viewers run."""

from __future__ import annotations

import re
from pathlib import Path

import browser

import adapterprobe as ap
from adapterprobe.reports import html as report
from adapterprobe.scan import DEMO_STORE

HOST = """<!DOCTYPE html><html><head><meta charset="utf-8">
<style>body{{background:rgb(250, 240, 230);font-family:serif;margin:8px}}
h3{{color:rgb(1, 2, 3)}} .cell{{border:1px solid #999;margin:8px}}</style></head>
<body><h3 id="host-title">a notebook cell above</h3><div class="cell">{fragment}</div>
</body></html>"""
COLOURS = {
    v: browser.hex_rgb(re.search(rf"--{v}:(#[0-9a-f]{{6}})", report.CSS)[1])
    for v in ("pass", "warn", "fail")
}


def show(chromium, tmp_path: Path, fragment: str, name: str):
    page = tmp_path / f"{name}.html"
    page.write_text(HOST.format(fragment=fragment), encoding="utf-8")
    return chromium.load(
        page,
        javascript=False,
        full_page=True,
        evaluate={
            "body_bg": "getComputedStyle(document.body).backgroundColor",
            "host_h3": "getComputedStyle(document.getElementById('host-title')).color",
            "svgs": "document.querySelectorAll('.adapterprobe-nb svg').length",
            "paths": "document.querySelectorAll('.adapterprobe-nb svg path').length",
        },
    )


def test_scan_report_displays_with_charts_and_leaves_the_notebook_alone(chromium, tmp_path):
    fragment = ap.scan(DEMO_STORE)._repr_html_()
    assert "<script" not in fragment and "<html" not in fragment
    res = show(chromium, tmp_path, fragment, "scan")
    assert res.errors == []
    assert res.values["body_bg"] == "rgb(250, 240, 230)"  # the host's own style holds
    assert res.values["host_h3"] == "rgb(1, 2, 3)"
    assert res.values["svgs"] >= 4 and res.values["paths"] > 10
    colours = browser.decode_png(res.screenshot).colours()
    for verdict in ("pass", "warn", "fail"):  # the verdict colours reached the page
        assert browser.near(colours, COLOURS[verdict]) > 20, verdict


def test_one_result_displays_its_loss_curve(chromium, tmp_path):
    result = ap.training_drift(DEMO_STORE / "spiky-nan")
    fragment = result._repr_html_()
    res = show(chromium, tmp_path, fragment, "result")
    assert res.errors == []
    assert res.values["body_bg"] == "rgb(250, 240, 230)"
    assert res.values["svgs"] >= 1 and res.values["paths"] >= 2
    assert browser.near(browser.decode_png(res.screenshot).colours(), COLOURS["warn"]) > 20
