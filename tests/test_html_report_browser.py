"""The HTML report in a real headless Chromium: it must load cleanly (no console
errors, no blocked resources), lay out at phone and desktop widths, filter and
page with JavaScript, show its content without it, run no injected script, and
load a 10,000-store page fast. The pages are the ones test_html_report.py checks."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import browser
import pytest
from test_html_report import HOSTILE, SETTINGS, WHEN, big_scan_page, by_store, demo_records

from adapterprobe.reports import html as report
from adapterprobe.reports.html import VERDICTS, write_html

# The CSS colour of each verdict, to find in screenshots.
COLOURS = {
    v: browser.hex_rgb(re.search(rf"--{v}:(#[0-9a-f]{{6}})", report.CSS)[1]) for v in VERDICTS
}


@pytest.fixture(scope="module")
def demo() -> list[dict[str, Any]]:
    return demo_records()


@pytest.fixture(scope="module")
def big_page(demo):
    return big_scan_page(demo)


# ---------------------------------------------------------------------------
# A real browser


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where screenshots go: $ADAPTERPROBE_SCREENSHOTS if set (to look at), else a temp dir."""
    keep = os.environ.get("ADAPTERPROBE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return Path(keep)
    return tmp_path_factory.mktemp("shots")


def test_browser_check_catches_console_errors_and_exceptions(chromium, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><p>hi</p><script>"
        "console.log('fine'); console.error('deliberate console error');"
        "setTimeout(function () { throw new Error('deliberate late exception'); }, 0);"
        "throw new TypeError('deliberate exception');"
        "</script></body></html>"
    )
    res = chromium.load(bad, screenshot=False)
    text = "\n".join(res.errors)
    assert "console.error: deliberate console error" in text
    assert "TypeError: deliberate exception" in text
    assert "deliberate late exception" in text
    assert ("log", "fine") in res.console
    # A blocked external resource is an error too (the report's CSP would cause these).
    csp = tmp_path / "csp.html"
    csp.write_text(
        '<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
        "<script>console.log(1)</script><p>x</p>"
    )
    assert chromium.load(csp, screenshot=False).errors
    good = tmp_path / "good.html"
    good.write_text("<!DOCTYPE html><p>ok</p><script>console.log('ok')</script>")
    assert chromium.load(good, screenshot=False).errors == []


def test_browser_timeout_kills_the_browser(chromium, tmp_path):
    slow = tmp_path / "slow.html"
    slow.write_text("<!DOCTYPE html><script>while (true);</script>")
    own = browser.Browser(chromium.path)
    start = time.monotonic()
    with pytest.raises(browser.BrowserTimeout, match=r"Page\.loadEventFired"):
        own.load(slow, timeout=2)
    assert time.monotonic() - start < 15
    with pytest.raises(ProcessLookupError):  # the whole process group is gone
        os.killpg(own.pid, 0)


def test_demo_page_in_a_browser(chromium, demo, tmp_path, shots):
    page = write_html(tmp_path / "demo.html", demo, settings=SETTINGS, generated_at=WHEN)
    for width, height in ((1280, 900), (420, 900)):
        res = chromium.load(
            page,
            width=width,
            height=height,
            full_page=True,
            evaluate={
                "overflow": "document.documentElement.scrollWidth - window.innerWidth",
                "shown": "document.getElementById('shown').textContent",
                "filter_visible": "!document.getElementById('filter').hidden",
            },
        )
        assert res.errors == []
        assert res.values["overflow"] <= 0, f"horizontal scroll at {width}px"
        assert res.values["shown"] == "Showing 4 of 4 stores." and res.values["filter_visible"]
        assert res.screenshot is not None
        shot = shots / f"demo-{width}.png"
        shot.write_bytes(res.screenshot)
        img = browser.decode_png(res.screenshot)
        assert img.width == width and img.height >= height
        colours = img.colours()
        assert len(colours) > 200, "the screenshot is nearly blank"
        background = colours.most_common(1)[0][1] / sum(colours.values())
        assert background < 0.8
        for verdict in {r["verdict"] for r in demo}:
            assert browser.near(colours, COLOURS[verdict]) > 50, f"no {verdict} colour in {shot}"


def test_content_works_without_javascript(chromium, demo, tmp_path):
    page = write_html(tmp_path / "demo.html", demo, generated_at=WHEN)
    res = chromium.load(
        page,
        javascript=False,
        screenshot=False,
        evaluate={
            "filter_hidden": "document.getElementById('filter').hidden",
            "stores": "document.querySelectorAll('[data-store]').length",
            "curves": "[...document.querySelectorAll('svg.curve')]"
            ".filter(el => el.getBoundingClientRect().width > 300).length",
        },
    )
    assert res.errors == []
    assert res.values["filter_hidden"]  # no dead controls without JS
    assert res.values["stores"] == len(by_store(demo))
    assert res.values["curves"] >= 1  # the problem store's curve is drawn and visible


def test_filter_and_paging_work_in_a_browser(chromium, demo, tmp_path):
    page = write_html(tmp_path / "demo.html", demo, generated_at=WHEN)
    only_fail = """(() => {
      for (const box of document.querySelectorAll('#filter input'))
        box.checked = box.value === 'fail';
      document.getElementById('filter').dispatchEvent(new Event('change'));
      return [...document.querySelectorAll('[data-store]')]
        .filter(el => el.getClientRects().length).map(el => el.id);
    })()"""
    res = chromium.load(page, screenshot=False, evaluate={"visible": only_fail})
    stores = list(by_store(demo))
    failing = {
        f"s{i}"
        for i, s in enumerate(stores)
        if any(r["verdict"] == "fail" for r in by_store(demo)[s])
    }
    assert set(res.values["visible"]) == failing and failing


def test_hostile_page_runs_no_injected_script(chromium, tmp_path):
    records = [
        {
            "store": HOSTILE,
            "adapter": None,
            "probe": "training_drift",
            "verdict": "warn",
            "message": HOSTILE,
        }
    ]
    page = write_html(tmp_path / "x.html", records, title=HOSTILE, generated_at=WHEN)
    res = chromium.load(page, evaluate={"text": "document.body.innerText"})
    assert res.errors == [] and res.dialogs == []
    assert HOSTILE in res.values["text"]


def test_ten_thousand_stores_load_fast_in_a_browser(chromium, big_page, tmp_path, shots):
    page_text, _, _ = big_page
    page = tmp_path / "big.html"
    page.write_text(page_text, encoding="utf-8")
    rows = """[...document.querySelectorAll('table.paged')].map(t => [...t.tBodies[0].rows]
      .filter(r => getComputedStyle(r).display !== 'none').length)"""
    res = chromium.load(page, evaluate={"rows": rows}, timeout=120)
    print(
        f"\n10k-store report in Chromium: {page.stat().st_size / 1e6:.2f} MB, load event after "
        f"{res.load_ms:.0f} ms (page timing: DOMContentLoaded "
        f"{res.timing.get('domContentLoadedEventEnd', 0):.0f} ms, "
        f"load end {res.timing.get('loadEventEnd', 0):.0f} ms)"
    )
    assert res.errors == []
    assert res.load_ms < 20_000
    assert len(res.values["rows"]) == 2  # more problem stores, more healthy stores
    assert all(0 < n <= report.PAGE_ROWS for n in res.values["rows"])  # both are paged
    assert res.screenshot is not None
    (shots / "big-1280.png").write_bytes(res.screenshot)
    assert len(browser.decode_png(res.screenshot).colours(step=2)) > 100


def test_missing_browser_fails_with_a_hint(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("ADAPTERPROBE_CHROMIUM", raising=False)
    with pytest.raises(browser.BrowserMissing, match=r"ensure_chromium\.sh"):
        browser.find_browser()
    assert shutil.which("chromium") is None
