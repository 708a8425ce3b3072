"""The HTML report: content from a real demo scan, escaping, determinism and size at
10,000 stores (test_html_report_browser.py loads the pages in a real Chromium)."""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import adapterprobe as ap
from adapterprobe.reports import html as report
from adapterprobe.reports.html import PLOT_LIMIT, VERDICTS, render_html, write_html
from adapterprobe.scan import DEMO_STORE

WHEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
SETTINGS = {
    "rules": "robust",
    "training_drift": {"min_steps": 10, "spike_sigma": 3.0},
    "gradient_ghost": {"min_steps_threshold": 50, "undertrained_layer_ratio": 2.0},
}
HOSTILE = "<script>alert(1)</script>"


# ---------------------------------------------------------------------------
# A tiny DOM: enough to ask which elements a page has and where.

VOID = {"meta", "input", "br", "img", "link", "hr", "source", "wbr", "area", "col", "embed"}


class Element:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Element | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.parts: list[Element | str] = []  # children and text, in order

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    def ancestors(self) -> Iterator[Element]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def store_id(self) -> str | None:
        """The id of the store (card, fold or row) this element belongs to."""
        for node in (self, *self.ancestors()):
            if "data-store" in node.attrs:
                return node.attrs.get("id")
        return None

    def has_class(self, name: str) -> bool:
        return name in (self.attrs.get("class") or "").split()


class Dom(HTMLParser):
    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.all: list[Element] = []
        self._open = [self.root]
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = self._add(tag, attrs)
        if tag not in VOID:
            self._open.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._add(tag, attrs)

    def _add(self, tag: str, attrs: list[tuple[str, str | None]]) -> Element:
        parent = self._open[-1]
        el = Element(tag, dict(attrs), parent)
        parent.children.append(el)
        parent.parts.append(el)
        self.all.append(el)
        return el

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, 0, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].parts.append(data)

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Element]:
        return [
            el
            for el in self.all
            if (tag is None or el.tag == tag)
            and (cls is None or el.has_class(cls))
            and all(el.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


def path_vertices(d: str) -> list[tuple[float, float]]:
    """The absolute M/L points of a path written by the renderer."""
    return [(float(x), float(y)) for x, y in re.findall(r"[ML](-?[\d.]+),(-?[\d.]+)", d)]


# ---------------------------------------------------------------------------
# Records


def demo_records() -> list[dict[str, Any]]:
    """The records of a scan of the bundled demo store."""
    records = [r.to_dict() for r in ap.scan(DEMO_STORE)]
    assert {r["verdict"] for r in records} >= {"pass", "warn", "fail"}
    return records


@pytest.fixture(scope="module")
def demo() -> list[dict[str, Any]]:
    return demo_records()


@pytest.fixture(scope="module")
def demo_page(demo) -> str:
    return render_html(demo, settings=SETTINGS, generated_at=WHEN)


def by_store(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["store"], []).append(r)
    return out


def store_ids(dom: Dom) -> dict[str, str]:
    """Store path -> element id, read from each detailed store's path line."""
    return {el.text: el.store_id() for el in dom.find("p", cls="path")}


def stretch(points: list[Any], n: int) -> list[list[Any]]:
    """A demo curve resampled to n steps (1..n), keeping its shape and its gaps."""
    return [[j + 1, points[j * len(points) // n][1]] for j in range(n)]


def synthetic(demo: list[dict[str, Any]], stores: int) -> list[dict[str, Any]]:
    """A big scan made by varying the real demo records: every store is a copy of
    a demo store under a new path with a scaled 512-step curve, per-layer ghost
    evidence and an adapter_weights record, so every drawing path is exercised;
    one store in 97 has a broken optimizer state (error). Evidence that repeats
    is shared between records (the renderer only reads it), which keeps this fast."""
    groups = list(by_store(demo).values())
    layouts = ("dlm", "hf-trainer", "peft", "lightning")
    cache: dict[Any, Any] = {}

    def drift(g: int, rec: dict[str, Any], k: int) -> dict[str, Any]:
        if ("drift", g, k) not in cache:
            ev, scale = rec["evidence"], 1 + k / 10
            n, long = len(ev["curve_sampled"]), stretch(ev["curve_sampled"], 512)
            cache["drift", g, k] = {
                **ev,
                "curve_sampled": [[s, None if y is None else y * scale] for s, y in long],
                "spike_steps": [s * 512 // n for s in ev["spike_steps"]],
                "nonfinite_steps": [s for s, y in long if y is None],
                "trend_sampled": [
                    [s, 4.9 * scale * (0.45 + 0.55 * math.exp(-s / 90))] for s, _ in long[::16]
                ],
            }
        return cache["drift", g, k]

    def ghost(rec: dict[str, Any], k: int) -> dict[str, Any]:
        if ("ghost", k) not in cache:
            cache["ghost", k] = {
                **rec["evidence"],
                "layer_exp_avg_sq": {str(n): 1e-5 * (1 + (n * 7 + k) % 5) for n in range(32)},
                "flagged_layers": [n for n in range(32) if (n * 7 + k) % 5 == 4][: k % 4],
            }
        return cache["ghost", k]

    def weights(k: int, bad: bool) -> dict[str, Any]:
        if ("weights", k, bad) not in cache:
            cache["weights", k, bad] = {
                "layer_delta_energy": {str(n): 0.5 + ((n * 13 + k) % 11) / 10 for n in range(32)},
                "dead_modules": ["layers.3.self_attn.q_proj", "layers.7.mlp.up_proj"]
                if bad
                else [],
                "top_modules": [
                    {"module": f"layers.{n}.self_attn.v_proj", "share": 0.3 / (n + 1)}
                    for n in range(5)
                ],
            }
        return cache["weights", k, bad]

    out = []
    for i in range(stores):
        g = i % len(groups)
        store = f"/data/adapters/team-{i % 40:02d}/run-{i:05d}"
        layout = layouts[i % len(layouts)]
        adapter = None
        for rec in groups[g]:
            r = {**rec, "store": store, "layout": layout}
            if rec["adapter"]:
                adapter = r["adapter"] = store + rec["adapter"][len(rec["store"]) :]
            if rec["evidence"].get("curve_sampled"):
                r["evidence"] = drift(g, rec, i % 7)
            if rec["probe"] == "gradient_ghost" and rec["verdict"] != "fail":
                r["evidence"] = ghost(rec, i % 20)
            if rec["probe"] == "gradient_ghost" and i % 97 == 0:
                r.update(
                    verdict="error",
                    score=None,
                    message=f"{adapter}/training_state.pt does not match its sha256 sidecar",
                    evidence={},
                )
            out.append(r)
        if adapter:
            bad = i % 9 == 0
            out.append(
                {
                    "store": store,
                    "adapter": adapter,
                    "probe": "adapter_weights",
                    "verdict": "warn" if bad else "pass",
                    "score": 0.5 if bad else 0.95,
                    "message": "2 modules never moved from the base" if bad else "weights trained",
                    "evidence": weights(i % 11, bad),
                    "layout": layout,
                }
            )
    return out


# ---------------------------------------------------------------------------
# Content of a real demo scan


def test_every_store_and_verdict_appears(demo, demo_page):
    dom = Dom(demo_page)
    stores = by_store(demo)
    ids = store_ids(dom)
    assert set(ids) >= {
        s for s in stores if any(r["verdict"] in ("warn", "fail", "error") for r in stores[s])
    }
    for store, records in stores.items():
        assert store in demo_page
        assert Path(store).name in demo_page
        shown = {
            el.attrs["data-v"]
            for el in dom.find("tr")
            if "data-v" in el.attrs and el.store_id() == ids.get(store, "?")
        }
        assert shown == {r["verdict"] for r in records}, store
    # The cards count stores by their roll-up: the worst record that is not
    # a skip, skip only when every record skipped.
    for verdict in VERDICTS:
        count = 0
        for records in stores.values():
            judged = [r["verdict"] for r in records if r["verdict"] != "skip"]
            rolled = max(judged, key=VERDICTS[::-1].index) if judged else "skip"
            count += rolled == verdict
        card = dom.find("li", cls=f"v-{verdict}")
        assert len(card) == 1 and card[0].text.startswith(str(count)), verdict
    for r in demo:
        assert report._esc(r["message"]) in demo_page
    # Worst first: the FAIL store's card comes before the WARN store's.
    severities = []
    for el in dom.find("article"):
        store = next(s for s, i in ids.items() if i == el.attrs["id"])
        severities.append(max(report.SEVERITY[r["verdict"]] for r in stores[store]))
    assert severities == sorted(severities, reverse=True)
    # Healthy stores are folded away, problem stores are not.
    for el in dom.find("details", cls="fold"):
        store = next(s for s, i in ids.items() if i == el.attrs["id"])
        assert {r["verdict"] for r in stores[store]} <= {"pass", "skip"}


def test_settings_and_time_are_shown(demo_page):
    dom = Dom(demo_page)
    rows = {el.text: el.parent.text for el in dom.find("th", scope="row")}
    assert "training_drift.min_steps" in rows and rows["training_drift.min_steps"].endswith("10")
    assert "rules" in rows
    assert '<time datetime="2025-01-02T03:04:05+00:00">2025-01-02 03:04:05 UTC</time>' in demo_page


def test_a_curve_per_drift_record_with_spikes_on_it(demo, demo_page):
    dom = Dom(demo_page)
    ids = store_ids(dom)
    drawn = 0
    for r in demo:
        curve = r["evidence"].get("curve_sampled")
        if r["probe"] != "training_drift" or not curve or r["store"] not in ids:
            continue
        sid = ids[r["store"]]
        svgs = [el for el in dom.find("svg", cls="curve") if el.store_id() == sid]
        assert len(svgs) == 1, r["store"]
        svg = svgs[0]
        assert svg.attrs["role"] == "img" and svg.attrs["aria-labelledby"]
        loss = [el for el in dom.find("path", cls="loss") if svg in el.ancestors()]
        assert len(loss) == 1
        vertices = path_vertices(loss[0].attrs["d"])
        finite = [p for p in curve if p[1] is not None]
        assert len(vertices) == len(finite)  # 80 points: nothing downsampled
        spikes = [el for el in dom.find("circle", cls="spike") if svg in el.ancestors()]
        assert [int(el.attrs["data-step"]) for el in spikes] == r["evidence"]["spike_steps"]
        for el in spikes:  # each marker sits on the curve's own vertex
            assert (float(el.attrs["cx"]), float(el.attrs["cy"])) in vertices
        nan = [el for el in dom.find("g", cls="nan") if svg in el.ancestors()]
        if r["evidence"]["nonfinite_steps"]:
            assert nan[0].attrs["data-steps"].split() == [
                str(s) for s in r["evidence"]["nonfinite_steps"]
            ]
            # the line is broken at the NaN: two sub-paths
            assert loss[0].attrs["d"].count("M") == 2
        else:
            assert not nan
        drawn += 1
    assert drawn >= 3
    spiky = next(
        r for r in demo if r["store"].endswith("spiky-nan") and r["probe"] == "training_drift"
    )
    assert spiky["evidence"]["spike_steps"] == [25, 50] and spiky["evidence"][
        "nonfinite_steps"
    ] == [65]


def bar_charts(page: str) -> list[tuple[str, Element]]:
    """(title, svg) of every bar chart on a page, in page order."""
    out = []
    for svg in Dom(page).find("svg", cls="bars"):
        title = next(el.text for el in svg.children if el.tag == "title")
        out.append((title, svg))
    return out


def test_demo_bars_robust(demo, demo_page):
    """rules="robust" on two-layer adapters: too few layers to compare, so each
    layer's mean second moment is drawn (no limit line), and the weights
    probe's delta energy per layer."""
    bars = bar_charts(demo_page)
    ghost = [
        r for r in demo if r["probe"] == "gradient_ghost" and r["evidence"].get("layer_exp_avg_sq")
    ]
    weights = [r for r in demo if r["evidence"].get("layer_delta_energy")]
    assert len(bars) == len(ghost) + len(weights) > 0
    means = [svg for title, svg in bars if title.startswith("Mean Adam exp_avg_sq per layer")]
    assert len(means) == len(ghost)
    for svg in means:
        rects = [el for el in svg.children if el.tag == "rect"]
        assert len(rects) == 2  # the demo adapters have two layers
        assert not [el for el in rects if el.has_class("flag")]
        assert not [el for el in svg.children if el.has_class("limit")]


def test_demo_bars_sway_against_the_calmest_layer(demo):
    """rules="sway": each layer's mean second moment with the sway limit
    (2x the calmest layer) drawn; 1.67x is under it, so nothing is flagged."""
    records = [r.to_dict() for r in ap.scan(DEMO_STORE, rules="sway")]
    page = render_html(records, settings=SETTINGS, generated_at=WHEN)
    with_layers = [r for r in records if r["evidence"].get("worst_layers")]
    ghost_bars = [svg for title, svg in bar_charts(page) if "exp_avg_sq" in title]
    assert len(ghost_bars) == len(with_layers) > 0
    for svg in ghost_bars:
        rects = [el for el in svg.children if el.tag == "rect"]
        assert len(rects) == 2
        assert not [el for el in rects if el.has_class("flag")]
        labels = [el.text for el in svg.children if el.has_class("lt")]
        assert labels == ["2× calmest"]


def test_robust_bars_compare_layers_with_their_peers():
    """A compared adapter: scores against peers, the exploded layer flagged,
    the limit drawn only when a bar comes near it."""
    scores = {str(i): 1.0 + 0.1 * i for i in range(6)}
    evidence = {
        "rules": "robust",
        "layer_exp_avg_sq": {k: 1e-6 for k in scores},
        "layer_ratio_to_peers": scores,
        "flagged_layers": [],
        "thresholds": {"layer_outlier_ratio": 1000.0},
    }
    calm = {
        "store": "/r/a",
        "adapter": "/r/a/v1",
        "probe": "gradient_ghost",
        "verdict": "pass",
        "score": 0.9,
        "message": "ok",
        "evidence": evidence,
    }
    hot = copy.deepcopy(calm) | {"store": "/r/b", "adapter": "/r/b/v1", "verdict": "warn"}
    hot["evidence"]["layer_ratio_to_peers"]["3"] = 4000.0
    hot["evidence"]["flagged_layers"] = [3]
    charts = dict(bar_charts(render_html([calm, hot], settings=SETTINGS, generated_at=WHEN)))
    assert len(charts) == 2
    for title, svg in charts.items():
        rects = [el for el in svg.children if el.tag == "rect"]
        assert len(rects) == 6
        flagged = [el for el in rects if el.has_class("flag")]
        limit = [el.text for el in svg.children if el.has_class("lt")]
        if "WARN above 1000×" in title:  # the calm one: limit named, not drawn
            assert not flagged and not limit
        else:
            assert len(flagged) == 1 and "layer 3" in flagged[0].text and limit == ["1000× limit"]


# ---------------------------------------------------------------------------
# Evidence the demo does not produce (yet)


def test_new_probe_bars_flags_trend_and_downsampling():
    steps = 5000
    curve = [[s, 3.0 - s / 5000 + (4.0 if s in (1234, 3333) else 0.0)] for s in range(1, steps + 1)]
    curve[2500][1] = None
    records = [
        {
            "store": "/runs/a",
            "adapter": None,
            "probe": "training_drift",
            "verdict": "warn",
            "score": 0.4,
            "message": "spiky",
            "evidence": {
                "curve_sampled": curve,
                "trend_sampled": [[s, 3.0 - s / 5000] for s in range(1, steps + 1, 10)],
                "spike_steps": [1234, 3333],
                "nonfinite_steps": [2501],
            },
        },
        {
            "store": "/runs/a",
            "adapter": "/runs/a/adapter/versions/v0003",
            "probe": "gradient_ghost",
            "verdict": "fail",
            "score": 0.3,
            "message": "layers 2 and 5 undertrained",
            "evidence": {
                "global_step": 1200,
                "layer_exp_avg_sq": {str(k): 1.0 + (9.0 if k in (2, 5) else 0.0) for k in range(8)},
                "flagged_layers": [2, 5],
            },
        },
        {
            "store": "/runs/a",
            "adapter": "/runs/a/adapter/versions/v0003",
            "probe": "adapter_weights",
            "verdict": "warn",
            "score": 0.5,
            "message": "dead modules",
            "evidence": {
                "layer_delta_energy": {str(k): float(k) for k in range(300)},
                "dead_modules": ["layers.1.q_proj", "layers.9.v_proj"],
                "top_modules": [
                    {"module": "layers.4.o_proj", "share": 0.42},
                    {"module": "x", "share": None},
                ],
            },
        },
    ]
    page = render_html(records, generated_at=WHEN)
    dom = Dom(page)
    loss = dom.find("path", cls="loss")[0]
    vertices = path_vertices(loss.attrs["d"])
    assert 50 < len(vertices) <= report.MAX_POINTS
    spikes = dom.find("circle", cls="spike")
    assert [el.attrs["data-step"] for el in spikes] == ["1234", "3333"]
    for el in spikes:  # min/max downsampling keeps the spike points themselves
        assert (float(el.attrs["cx"]), float(el.attrs["cy"])) in vertices
    assert dom.find("g", cls="nan")[0].attrs["data-steps"] == "2501"
    assert len(path_vertices(dom.find("path", cls="trend")[0].attrs["d"])) <= report.MAX_POINTS
    charts = {el.children[0].text: el for el in dom.find("svg", cls="bars")}
    ghost = charts["Mean Adam exp_avg_sq per layer"]
    weights = charts["Adapter delta energy per layer"]
    flags = [el for el in ghost.children if el.tag == "rect" and el.has_class("flag")]
    assert [el.children[0].text for el in flags] == ["layer 2: 10", "layer 5: 10"]
    assert dom.find("path", cls="limit")  # the 2x-calmest line
    bars = [el for el in weights.children if el.tag == "rect"]
    assert report.MAX_BARS // 2 < len(bars) <= report.MAX_BARS  # 300 layers, bucketed
    assert "layers.1.q_proj" in page and "42.0%" in page and "global_step 1200" in page
    # A module name wraps at its dots, never inside a word.
    assert '<td class="mod">layers.<wbr>4.<wbr>o_proj</td>' in page
    assert ".mod{" in page and "overflow-wrap:break-word}" in page.split(".mod{", 1)[1][:120]


def test_wide_ranging_losses_get_a_log_axis():
    curve = [[s, 10.0 * 0.97**s] for s in range(1, 301)]  # 10 down to ~0.001
    record = {
        "store": "/r",
        "adapter": None,
        "probe": "training_drift",
        "verdict": "pass",
        "message": "ok",
        "evidence": {"curve_sampled": curve, "nonfinite_steps": [7, 8, 9, 10, 40]},
    }
    dom = Dom(render_html([record], generated_at=WHEN))
    svg = dom.find("svg", cls="curve")[0]
    labels = [el.text for el in svg.children if el.tag == "text"]
    assert "loss (log scale)" in labels
    assert {"10", "1", "0.1", "0.01"} <= set(labels)  # decade ticks
    ys = [y for _, y in path_vertices(dom.find("path", cls="loss")[0].attrs["d"])]
    gaps = [b - a for a, b in itertools.pairwise(ys)]
    assert max(gaps) - min(gaps) < 0.3  # exponential decay is a straight line on log y
    assert "non-finite: steps 7–10, 40" in svg.parent.text


def test_tolerates_missing_null_and_unknown_fields():
    records = [
        {"store": "/s/x", "probe": "shiny_new_probe", "verdict": "warn", "message": "new thing"},
        {
            "store": "/s/x",
            "adapter": "/s/x/a",
            "probe": "gradient_ghost",
            "verdict": "pass",
            "evidence": None,
        },
        {
            "store": "/s/y",
            "adapter": None,
            "probe": "training_drift",
            "verdict": "pass",
            "score": float("nan"),
            "message": "all NaN",
            "evidence": {
                "curve_sampled": [[1, None], [2, None], ["bad"], None, [3, "x"]],
                "trend_sampled": None,
                "spike_steps": None,
                "nonfinite_steps": [1, "two", None],
                "layer_exp_avg_sq": "not a dict",
            },
        },
        {
            "store": "/s/z",
            "adapter": "/s/z/v1",
            "probe": "gradient_ghost",
            "verdict": "mystery",
            "score": None,
            "message": None,
            "evidence": {
                "layer_exp_avg_sq": {"0": None, "1": float("inf")},
                "flagged_layers": None,
                "worst_layers": [None, {"layer": 0}],
            },
        },
        {
            "store": "/s/w",
            "probe": "adapter_weights",
            "verdict": "skip",
            "evidence": {"top_modules": "x"},
        },
        {},
    ]
    page = render_html(records, settings={}, generated_at="then")
    dom = Dom(page)
    assert "shiny_new_probe" in page and "new thing" in page
    assert "mystery" in page  # an unknown verdict is shown as written, counted as error
    assert dom.find("li", cls="v-error")[0].text.startswith("2")  # "mystery" and the empty record
    assert not dom.find("svg", cls="curve")  # nothing finite to draw
    assert "No settings were recorded" in page
    assert render_html([], generated_at=WHEN).count("<article") == 0
    assert "This scan produced no records" in render_html([], generated_at=WHEN)


def test_escaping():
    records = [
        {
            "store": f"/data/{HOSTILE}",
            "adapter": f"/data/{HOSTILE}/v\"1'><img src=x onerror=alert(2)>",
            "probe": "gradient_ghost",
            "verdict": "fail",
            "score": 0.0,
            "message": "<b>bold</b> & <img src=x onerror=alert(3)>",
            "evidence": {
                "note": "</title><script>alert(4)</script>",
                "layer_exp_avg_sq": {"<i>": 1.0, "0": 2.0},
                "flagged_layers": ["<i>"],
            },
            "layout": '"><script>alert(5)</script>',
        },
        {
            "store": HOSTILE,
            "adapter": None,
            "probe": "<probe>",
            "verdict": "<verdict>",
            "score": None,
            "message": "ok",
            "evidence": {"dead_modules": ["<svg onload=alert(6)>"]},
        },
    ]
    page = render_html(records, title="<title>&", settings={"<k>": "<v>"}, generated_at=HOSTILE)
    for raw in (
        "<script>alert",
        "<img",
        "<b>bold",
        "<i>",
        "<svg onload",
        "<probe>",
        "<verdict>",
        "<k>",
    ):
        assert raw not in page, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &lt;img src=x onerror=alert(3)&gt;" in page
    dom = Dom(page)
    assert len(dom.find("script")) == 1  # only the report's own
    assert not [el for el in dom.all if any(k.startswith("on") for k in el.attrs)]
    assert any(el.text == HOSTILE for el in dom.find("span", cls="name"))
    assert dom.find("title")[0].text == "<title>&"


def test_same_input_same_page(demo):
    first = render_html(demo, settings=SETTINGS, generated_at=WHEN)
    again = render_html(copy.deepcopy(demo), settings=copy.deepcopy(SETTINGS), generated_at=WHEN)
    assert first == again
    assert render_html(demo, generated_at=WHEN) != render_html(demo, generated_at="another time")


def test_same_page_in_another_process(demo, demo_page, tmp_path):
    """Set or dict-order leaks would differ between interpreters with other hash seeds."""
    source = tmp_path / "records.json"
    source.write_text(json.dumps(demo))
    script = (
        "import json, sys\n"
        "from datetime import datetime, timezone\n"
        "from adapterprobe.reports.html import render_html\n"
        "records = json.load(open(sys.argv[1]))\n"
        "settings = json.loads(sys.argv[2])\n"
        "when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)\n"
        "sys.stdout.write(render_html(records, settings=settings, generated_at=when))\n"
    )
    for seed in ("0", "3", "5"):  # these seeds order small string sets differently
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script, str(source), json.dumps(SETTINGS)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert out == demo_page


def test_plot_limit_turns_the_rest_into_rows(demo):
    records = synthetic(demo, 40)
    dom = Dom(render_html(records, generated_at=WHEN, plot_limit=5))
    assert len(dom.find("svg", cls="curve")) <= 5
    assert len(dom.find(cls="card")) == 5 and not dom.find("details", cls="fold")
    rows = [el for el in dom.find("tr") if "data-store" in el.attrs]
    assert len(rows) == 35
    assert len({el.attrs["id"] for el in dom.all if "data-store" in el.attrs}) == 40


def test_a_store_with_many_versions_stays_bounded():
    records = [
        {
            "store": "/s/many",
            "adapter": f"/s/many/adapter/versions/v{k:04d}",
            "probe": "gradient_ghost",
            "verdict": "warn" if k == 777 else "pass",
            "message": f"version {k}",
            "evidence": {"layer_exp_avg_sq": {str(n): 1.0 + n for n in range(16)}},
        }
        for k in range(1000)
    ]
    page = render_html(records, generated_at=WHEN)
    dom = Dom(page)
    assert len(page) < 200_000
    assert "version 777" in page  # the warn comes first, so it is listed
    assert len(dom.find("svg", cls="bars")) == report.MAX_FIGURES
    assert (
        f"and {1000 - report.MAX_ROWS} more records, not listed: {1000 - report.MAX_ROWS} pass"
        in page
    )
    assert f"{1000 - report.MAX_FIGURES} more adapter charts are not drawn" in page


def test_write_html_is_atomic(demo, tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("old")
    written = write_html(target, demo, generated_at=WHEN)
    assert written == target
    assert target.read_text(encoding="utf-8") == render_html(demo, generated_at=WHEN)
    assert os.listdir(tmp_path) == ["report.html"]

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(report.os, "replace", broken)
    with pytest.raises(ap.UsageError, match="disk full"):
        write_html(target, demo, title="new", generated_at=WHEN)
    assert "new</title>" not in target.read_text(encoding="utf-8")
    assert os.listdir(tmp_path) == ["report.html"]  # no temp file left behind


def test_ten_thousand_stores_stay_small(demo, big_page):
    page, seconds, records = big_page
    size = len(page.encode())
    print(
        f"\n10k-store report: {len(records)} records, {size / 1e6:.2f} MB, "
        f"rendered in {seconds:.1f} s"
    )
    assert size < 15e6
    dom = Dom(page)
    assert len(dom.find("svg", cls="curve")) <= PLOT_LIMIT
    assert len({el.attrs["id"] for el in dom.all if "data-store" in el.attrs}) == 10_000
    for path in dom.find("path", cls="loss"):
        assert len(path_vertices(path.attrs["d"])) <= report.MAX_POINTS


def big_scan_page(demo: list[dict[str, Any]]) -> tuple[str, float, list[dict[str, Any]]]:
    """A page for 10,000 synthetic stores: (page, seconds to render, records)."""
    records = synthetic(demo, 10_000)
    start = time.perf_counter()
    page = render_html(records, settings=SETTINGS, generated_at=WHEN)
    return page, time.perf_counter() - start, records


@pytest.fixture(scope="module")
def big_page(demo):
    return big_scan_page(demo)


def test_a_drift_record_says_what_the_run_was(demo) -> None:
    drift = [r for r in demo if r["probe"] == "training_drift" and r["evidence"].get("run_facts")]
    assert drift, "the demo's drift records carry run_facts"
    text = drift[0]["evidence"]["run_facts_text"]
    record = dict(drift[0], evidence={**drift[0]["evidence"], "run_facts_text": text + " <b>x</b>"})
    page = render_html([record], settings=SETTINGS, generated_at=WHEN)
    assert "run: " + text.split(" (")[0] in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # escaped
