"""The report's overlay of the runs' training loss, and the y-axis layout of
every chart: one path per run from the real demo scan, a cap with a line
saying what was left out and why, escaped names, a picker that works without
JavaScript, no evidence read beyond the stores the page draws, and rotated
y-axis titles that clear the tick labels (estimated from the emitted SVG,
then measured in Chromium)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from test_html_report import (
    HOSTILE,
    WHEN,
    Dom,
    Element,
    by_store,
    demo_records,
    path_vertices,
    synthetic,
)

from adapterprobe.comparison.render_html import _curves_chart
from adapterprobe.reports import html as report
from adapterprobe.reports.html import render_html, write_streamed_html
from adapterprobe.reports.probe_charts import MAX_POINTS, OVERLAY_RUNS, PHONE_FONT
from adapterprobe.reports.svg import FONT, PALETTE
from adapterprobe.scan import DEMO_STORE

ESC_NAME = f"/runs/{HOSTILE}\x1b[2J\x1b]0;pwned\x07"


@pytest.fixture(scope="module")
def demo() -> list[dict[str, Any]]:
    return demo_records()


def overlay(dom: Dom) -> Element:
    (section,) = dom.find("section", id="overlay")
    return section


def inside(el: Element, parent: Element) -> bool:
    return parent in el.ancestors()


def run_paths(dom: Dom) -> list[Element]:
    (svg,) = dom.find("svg", cls="overlay")
    return [el for el in dom.find("path", cls="ov-line") if inside(el, svg)]


def legend(dom: Dom) -> list[Element]:
    (picker,) = dom.find("fieldset", cls="ov-pick")
    return [el for el in dom.find("label") if inside(el, picker)]


def page_order(dom: Dom) -> list[str]:
    """Store paths in the order the page shows them with charts."""
    return [el.text for el in dom.find("p", cls="path")]


def drift_curve(records: list[dict[str, Any]], store: str) -> list[Any]:
    rec = next(r for r in records if r["store"] == store and r["probe"] == "training_drift")
    return rec["evidence"]["curve_sampled"]


# ---------------------------------------------------------------------------
# The overlay


def test_a_line_per_run_of_the_demo_scan(demo, monkeypatch):
    monkeypatch.chdir(DEMO_STORE)  # runs are named from the working directory
    page = render_html(demo, generated_at=WHEN)
    dom = Dom(page)
    section = overlay(dom)
    # Near the top: right after the summary, before the stores.
    ids = [el.attrs.get("id") for el in dom.find("section")]
    assert ids[:3] == ["summary", "overlay", "problems"]

    paths, keys = run_paths(dom), legend(dom)
    stores = by_store(demo)
    assert len(stores) == 4 and len(paths) == 4 == len(keys)
    names = {Path(s).name: s for s in stores}
    # The runs in the page's order: the stores needing attention first.
    shown = [p.text for p in paths]  # each path's <title> is its run's name
    assert shown == [Path(s).name for s in page_order(dom)]
    assert shown[0] in ("smoke-test", "spiky-nan")  # the fail and the warn store
    colours = [p.attrs["stroke"] for p in paths]
    assert colours == list(PALETTE[:4])
    for i, (path, key) in enumerate(zip(paths, keys, strict=True)):
        assert path.has_class(f"ov-{i}")
        curve = drift_curve(demo, names[path.text])
        finite = [p for p in curve if p[1] is not None]
        vertices = path_vertices(path.attrs["d"])
        assert len(vertices) == len(finite)  # 80 points or fewer: nothing downsampled
        if len(finite) < len(curve):  # spiky-nan's NaN step lifts the pen
            assert path.attrs["d"].count("M") == 2
        # The key names the same run, in the run's colour, and labels a checkbox.
        assert key.attrs["for"] == f"ov-{i}" and path.text in key.text
        assert f"--c:{colours[i]}" in key.attrs["style"]
        (box,) = dom.find("input", id=f"ov-{i}")
        assert box.attrs["type"] == "checkbox" and "checked" in box.attrs
        assert inside(box, section)
        # The stylesheet hides the line of an unchecked box.
        assert f"#ov-{i}:not(:checked)~.ov-fig .ov-{i}{{display:none}}" in report.CSS
    # Every run is drawn: no "left out" line.
    assert not dom.find("p", cls="ov-out")
    # The runs share one x scale: a step sits at the same x on every line.
    at: dict[float, set[float]] = {}
    for path in paths:
        steps = [s for s, y in drift_curve(demo, names[path.text]) if y is not None]
        for step, (x, _) in zip(steps, path_vertices(path.attrs["d"]), strict=True):
            at.setdefault(step, set()).add(x)
    assert max(len(xs) for xs in at.values()) == 1 and len(at) >= 80


def test_the_overlay_needs_no_script_and_runs_none(demo):
    page = render_html(demo, generated_at=WHEN)
    start = page.index('<section id="overlay"')
    section = page[start : page.index("</section>", start)]
    assert "<script" not in section.lower()
    dom = Dom(page)
    assert not [
        el
        for el in dom.all
        if inside(el, overlay(dom)) and any(k.startswith("on") for k in el.attrs)
    ]
    assert len(dom.find("script")) == 1  # only the report's own (hash-pinned) filter script
    assert dom.find("button", type="reset")  # "Show all": a form reset, no script


def worst_verdicts(records: list[dict[str, Any]], drawn: list[str]) -> list[int]:
    """The severity of each drawn store's worst judged record."""
    stores = by_store(records)
    return [
        max(report.SEVERITY[r["verdict"]] for r in stores[n] if r["verdict"] != "skip")
        for n in drawn
    ]


def test_at_most_n_runs_the_worst_and_the_healthy_beside_them(demo):
    """Issue 56, item 6: of 40 runs, half of them needing attention, the
    overlay drew the 12 worst and no healthy run to compare them with."""
    records = synthetic(demo, 40)
    dom = Dom(render_html(records, generated_at=WHEN))
    paths = run_paths(dom)
    assert len(paths) == OVERLAY_RUNS == 12
    assert len(legend(dom)) == OVERLAY_RUNS and len(dom.find("input", cls="sr")) == OVERLAY_RUNS
    # The runs needing attention in the page's order, worst first, then the
    # first healthy runs in the page's order.
    order = page_order(dom)
    drawn = [p.text for p in paths]
    worst = worst_verdicts(records, order)
    problems = [n for n, w in zip(order, worst, strict=True) if w >= report.SEVERITY["warn"]]
    healthy = [n for n, w in zip(order, worst, strict=True) if w < report.SEVERITY["warn"]]
    assert len(problems) > OVERLAY_RUNS and len(healthy) >= report.OVERLAY_HEALTHY
    kept = OVERLAY_RUNS - report.OVERLAY_HEALTHY
    assert drawn == problems[:kept] + healthy[: report.OVERLAY_HEALTHY]
    assert worst_verdicts(records, drawn[:kept]) == sorted(
        worst_verdicts(records, drawn[:kept]), reverse=True
    )
    assert max(worst_verdicts(records, drawn[kept:])) < report.SEVERITY["warn"]
    assert min(worst_verdicts(records, drawn[:kept])) >= report.SEVERITY["warn"]
    for path in paths:  # 512-step curves, downsampled
        assert 0 < len(path_vertices(path.attrs["d"])) <= MAX_POINTS
    (note,) = dom.find("p", cls="ov-out")
    assert note.text.startswith("12 of 40 runs drawn, 28 left out: at most 12 curves")
    assert "needing attention in the order of the stores below, worst first" in note.text
    assert "at least 3 healthy runs where there are any" in note.text
    assert "Training loss of the runs (40)" in overlay(dom).text


def test_few_runs_needing_attention_leave_the_room_to_healthy_ones(demo):
    records = synthetic(demo, 40)
    stores = by_store(records)
    bad = [s for s, rs in stores.items() if any(r["verdict"] in ("warn", "fail") for r in rs)]
    records = [r for r in records if r["store"] not in bad[2:]]
    dom = Dom(render_html(records, generated_at=WHEN))
    paths = run_paths(dom)
    assert len(paths) == OVERLAY_RUNS
    drawn = [p.text for p in paths]
    order = page_order(dom)
    assert drawn == order[:OVERLAY_RUNS]
    assert set(drawn[:2]) == set(bad[:2])


def test_plot_limit_bounds_the_runs_looked_at(demo):
    records = synthetic(demo, 40)
    dom = Dom(render_html(records, generated_at=WHEN, plot_limit=5))
    paths = run_paths(dom)
    assert len(paths) == 5 + report.OVERLAY_HEALTHY
    order = page_order(dom)
    assert [p.text for p in paths][:5] == order
    assert max(worst_verdicts(records, [p.text for p in paths][5:])) < report.SEVERITY["warn"]
    (note,) = dom.find("p", cls="ov-out")
    assert "8 of 40 runs drawn, 32 left out" in note.text
    assert "among the 5 stores drawn with charts" in note.text
    dom = Dom(render_html(records, generated_at=WHEN, plot_limit=0))
    assert not dom.find("svg", cls="overlay")
    assert "0 of 40 runs drawn, 40 left out" in overlay(dom).text


def test_no_overlay_without_two_runs(demo):
    one = [r for r in demo if r["store"].endswith("healthy")]
    assert 'id="overlay"' not in render_html(one, generated_at=WHEN)
    # A store without logs is not a run (its training_drift record skipped).
    skipped = [
        {**r, "store": "/x/no-logs", "verdict": "skip", "evidence": {}}
        for r in one
        if r["probe"] == "training_drift"
    ]
    assert 'id="overlay"' not in render_html(one + skipped, generated_at=WHEN)


def test_run_names_are_escaped_in_the_legend(demo):
    records = []
    for name in (ESC_NAME, "/runs/plain"):
        for r in demo:
            if r["store"].endswith("spiky-nan"):
                records.append({**r, "store": name, "adapter": None})
    page = render_html(records, generated_at=WHEN)
    assert "<script>alert" not in page
    for raw in ("\x1b", "\x07"):
        assert raw not in page  # no terminal escape, should the page be printed
    dom = Dom(page)
    visible = f"{HOSTILE}\\x1b[2J\\x1b]0;pwned\\x07"
    keys = legend(dom)
    assert any(visible in k.text for k in keys)
    assert any(visible in (k.attrs.get("title") or "") for k in keys)
    assert any(p.text.endswith(visible) for p in run_paths(dom))
    (desc,) = [el for el in dom.find("desc") if inside(el, overlay(dom))]
    assert visible in desc.text
    assert len(dom.find("script")) == 1
    assert not [el for el in dom.all if any(k.startswith("on") for k in el.attrs)]


class CountingEvidence(Mapping[str, Any]):
    """Evidence that records which stores' evidence was read."""

    def __init__(self, data: Mapping[str, Any], store: str, reads: set[str]) -> None:
        self.data, self.store, self.reads = data, store, reads

    def _read(self) -> Mapping[str, Any]:
        self.reads.add(self.store)
        return self.data

    def __getitem__(self, key: str) -> Any:
        return self._read()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


def test_only_the_drawn_stores_evidence_is_read(demo):
    """The overlay looks only at stores the page draws charts for (their
    evidence is read anyway), so a big scan's report stays as fast."""
    reads: set[str] = set()
    records = [
        {**r, "evidence": CountingEvidence(r["evidence"], r["store"], reads)}
        for r in synthetic(demo, 300)
    ]
    dom = Dom(render_html(records, generated_at=WHEN, plot_limit=20))
    drawn = {p.text for p in run_paths(dom)}
    assert len(drawn) == OVERLAY_RUNS
    # Beyond the stores drawn with charts, only the healthy runs drawn.
    charted = set(page_order(dom))
    assert reads and len(charted) == 20
    assert reads - charted == drawn - charted and len(drawn - charted) == report.OVERLAY_HEALTHY
    reads.clear()
    render_html(records, generated_at=WHEN, plot_limit=0)
    assert not reads


def test_a_streamed_report_draws_the_same_overlay(demo, tmp_path):
    """`adapterprobe report` streams: the stores it keeps evidence for are the
    ones the overlay draws."""
    records = synthetic(demo, 60)
    whole = Dom(render_html(records, generated_at=WHEN, plot_limit=8))
    path, _ = write_streamed_html(
        tmp_path / "r.html",
        [records[i : i + 7] for i in range(0, len(records), 7)],
        plot_limit=8,
        generated_at=WHEN,
    )
    streamed = Dom(path.read_text(encoding="utf-8"))
    assert [p.attrs["d"] for p in run_paths(streamed)] == [p.attrs["d"] for p in run_paths(whole)]
    assert len(run_paths(streamed)) == 8 + report.OVERLAY_HEALTHY  # the healthy ones kept too


# ---------------------------------------------------------------------------
# The y axis title clears the tick labels


def text_box(el: Element, font: float) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a chart text, its width estimated at 0.6 em
    a character, its height as a sans-serif font's box (DejaVu Sans: 0.93 em
    above the baseline, 0.24 em below)."""
    width = len(el.text) * 0.6 * font
    if "transform" in el.attrs:  # translate(x y) rotate(-90), anchored at its middle
        x, y = map(
            float,
            re.fullmatch(
                r"translate\(([-\d.]+) ([-\d.]+)\) rotate\(-90\)", el.attrs["transform"]
            ).groups(),
        )
        return (x - 0.95 * font, y - width / 2, x + 0.25 * font, y + width / 2)
    x, y = float(el.attrs["x"]), float(el.attrs["y"])
    assert el.has_class("yt")  # anchored at its end
    return (x - width, y - 0.95 * font, x, y + 0.25 * font)


def overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def assert_titles_clear(page: str, font_of: dict[str, float]) -> int:
    """Every chart's y title misses every y tick label and stays on the
    picture; returns how many charts had a tick label of 6 or more characters."""
    dom = Dom(page)
    wide = 0
    for svg in dom.find("svg"):
        (title,) = [el for el in svg.children if el.tag == "text" and el.has_class("yl")]
        ticks = [el for el in svg.children if el.tag == "text" and el.has_class("yt")]
        kind = svg.attrs["class"]
        big = next((f for k, f in font_of.items() if svg.has_class(k)), FONT)
        for font in sorted({FONT, big}):
            box = text_box(title, font)
            assert box[0] >= 0, (kind, title.text, box)
            for tick in ticks:
                assert not overlaps(box, text_box(tick, font)), (kind, font, tick.text, box)
        wide += max(len(t.text) for t in ticks) >= 6
    return wide


def wide_ticks_records() -> list[dict[str, Any]]:
    """A loss from 0.01 down to 1e-8 (a log axis labelled 0.01, 0.0001, 1e-6,
    1e-8), its grad norm, and bars of a few ten-thousandths."""
    curve = [[s, 0.01 * 0.94**s] for s in range(1, 300)]
    bars = {str(n): 0.0001 * (1 + n % 3) for n in range(8)}
    return [
        {
            "store": f"/runs/{name}",
            "adapter": None,
            "probe": "training_drift",
            "verdict": "warn",
            "message": "m",
            "evidence": {"curve_sampled": curve, "grad_norm_sampled": curve},
        }
        for name in ("a", "b")
    ] + [
        {
            "store": "/runs/a",
            "adapter": "/runs/a/adapter",
            "probe": "adapter_weights",
            "verdict": "warn",
            "message": "m",
            "evidence": {"layer_delta_energy": bars},
        }
    ]


def test_y_title_clears_wide_tick_labels_on_a_log_axis():
    page = render_html(wide_ticks_records(), generated_at=WHEN)
    dom = Dom(page)
    curve = dom.find("svg", cls="curve")[0]
    labels = [el.text for el in curve.children if el.tag == "text"]
    assert "loss (log scale)" in labels and "0.0001" in labels and "1e-6" in labels
    fonts = {"curve": PHONE_FONT, "overlay": PHONE_FONT, "gradnorm": FONT, "bars": FONT}
    assert assert_titles_clear(page, fonts) >= 4  # loss, grad norm, overlay, bars
    # The loss charts' text grows to PHONE_FONT on a phone (the page's CSS).
    assert ".chart.curve text,.chart.overlay text{font-size:15px}" in report.CSS


def test_y_title_clears_the_tick_labels_of_the_demo_and_compare(demo):
    page = render_html(synthetic(demo, 30), generated_at=WHEN)
    fonts = {"curve": PHONE_FONT, "overlay": PHONE_FONT, "gradnorm": FONT, "bars": FONT}
    assert_titles_clear(page, fonts)
    # compare's overlay (10px text) shares the layout.
    items = [
        {"label": n, "curve": {"sample": [[s, 0.001 * 0.9**s] for s in range(1, 60)]}}
        for n in ("a", "b")
    ]
    chart = _curves_chart(items)
    assert "0.0001" in chart
    assert_titles_clear(chart, {"curves": FONT})


# ---------------------------------------------------------------------------
# In a real browser


PICK = """(() => {
  const shown = i => getComputedStyle(document.querySelector('path.ov-' + i)).display !== 'none';
  const out = {before: [0, 1, 2].map(shown)};
  document.querySelector('label[for="ov-1"]').click();
  out.checked = document.getElementById('ov-1').checked;
  out.after = [0, 1, 2].map(shown);
  out.struck = getComputedStyle(document.querySelector('label[for="ov-1"]')).textDecorationLine;
  document.querySelector('form.ov').reset();
  out.reset = [0, 1, 2].map(shown);
  return out;
})()"""

# Chart text as Chromium lays it out: every y title against every y tick label.
MEASURE = """[...document.querySelectorAll('svg')].map(svg => {
  const r = el => el.getBoundingClientRect();
  const t = r(svg.querySelector('.yl')), s = r(svg);
  const hits = [...svg.querySelectorAll('.yt')].filter(el => {
    const b = r(el);
    return t.left < b.right && b.left < t.right && t.top < b.bottom && b.top < t.bottom;
  }).map(el => el.textContent);
  return {cls: svg.getAttribute('class'), hits: hits, inside: t.left >= s.left - 0.5};
})"""


def test_the_picker_works_without_javascript(chromium, demo, tmp_path):
    page = tmp_path / "demo.html"
    page.write_text(render_html(demo, generated_at=WHEN), encoding="utf-8")
    res = chromium.load(page, javascript=False, screenshot=False, evaluate={"pick": PICK})
    assert res.errors == []
    pick = res.values["pick"]
    assert pick["before"] == [True, True, True]
    assert pick["checked"] is False and pick["after"] == [True, False, True]
    assert pick["struck"] == "line-through"
    assert pick["reset"] == [True, True, True]


@pytest.mark.parametrize("width", [1280, 420])
def test_y_titles_clear_the_tick_labels_in_a_browser(chromium, tmp_path, width):
    page = tmp_path / "wide.html"
    page.write_text(render_html(wide_ticks_records(), generated_at=WHEN), encoding="utf-8")
    res = chromium.load(page, width=width, screenshot=False, evaluate={"charts": MEASURE})
    assert res.errors == []
    charts = res.values["charts"]
    assert len(charts) >= 4
    for chart in charts:
        assert chart["hits"] == [] and chart["inside"], chart


def test_a_masked_zero_loss_does_not_flatten_a_blow_up_onto_a_linear_axis():
    """A NaN-masked run logs its loss as 0.0; beside a run that blew up to
    4,000, the healthy curves were flat lines at the bottom of a linear
    axis (issue 56, item 6). The positive values decide the axis, and a 0 is
    a gap in its curve."""
    from adapterprobe.reports.svg import Line, overlay_chart

    healthy = [(float(s), 2.0 * 0.99**s + 0.5) for s in range(1, 200)]
    blown = [(float(s), 2.0 + 20.0 * s) for s in range(1, 200)]
    masked = [(float(s), 2.0 if s < 100 else 0.0) for s in range(1, 200)]
    lines = [Line(name, "#000", pts) for name, pts in (("h", healthy), ("b", blown), ("m", masked))]
    chart, log = overlay_chart(
        lines,
        "t",
        "t",
        size=(640, 260),
        box=(58.0, 14.0, 628.0, 220.0),
        log_ratio=30.0,
        max_points=MAX_POINTS,
    )
    assert log and "loss (log scale)" in chart
    # all-positive curves that span less than the ratio stay linear
    _, flat = overlay_chart(
        lines[:1],
        "u",
        "u",
        size=(640, 260),
        box=(58.0, 14.0, 628.0, 220.0),
        log_ratio=30.0,
        max_points=MAX_POINTS,
    )
    assert not flat
