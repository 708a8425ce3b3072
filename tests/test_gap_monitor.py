"""gap_monitor: the GAP monitor's records read back and judged.

The reader is held to a plain-Python reference (``json.loads`` per line) under
Hypothesis. The verdicts are held to faults that training itself produces, in
a plain PyTorch loop monitored by the real :class:`GAPMonitor`: a dead ReLU
(its layers get exactly zero gradient), a weight gone NaN, a learning rate
that climbs until the activations blow up; and a healthy run passes. A scan
of an HF Trainer output dir that the monitor wrote its logs into still sees
the run's checkpoints.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapterprobe as ap
import adapterprobe._core as _core

# -- the reader against json.loads ----------------------------------------------------

KEYS = st.sampled_from(
    [
        "gap/summary/grads/l2_norm",
        "gap/summary/grads/nonfinite",
        "gap/summary/grads/layers/model.layers.0/l2_norm",
        "gap/summary/activations/rms",
        "gap/summary/activations/top_max_abs/model.layers.1.mlp",
        "gap/grads/model.x.weight/nonfinite",
        "gap/grads/model.x.weight/mean",  # per-tensor, not read
        "gap/params/model.x.weight/var",  # per-tensor, not read
        "other",
    ]
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.none(),
    st.booleans(),
    st.text(max_size=3),
)


def wanted(key: str) -> bool:
    return key.startswith("gap/summary/") or (key.startswith("gap/") and key.endswith("/nonfinite"))


def reference(text: str) -> list[tuple[int, dict[str, float]]]:
    """What a reader of the sink's lines must return, by json.loads."""
    out = []
    for line in text.split("\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("type") != "gap":
            continue
        step, stats = obj.get("step"), obj.get("stats")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        kept = {}
        if isinstance(stats, dict):
            for key, value in stats.items():
                if wanted(key) and isinstance(value, int | float) and not isinstance(value, bool):
                    kept[key] = float(value)
        out.append((step, kept))
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


record = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["gap", "gap", "step"]),
        "step": st.integers(0, 10**9),
        "stats": st.dictionaries(KEYS, VALUES, max_size=6),
    }
)
line = st.one_of(
    record.map(lambda r: json.dumps(r, sort_keys=True)),
    st.just('{"type": "gap", "step": 3, "stats": {"gap/summary/grads/l2_norm": 1.0}'),  # torn
    st.text(max_size=20).filter(lambda s: "\n" not in s and "\r" not in s),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(line, max_size=12))
def test_reader_matches_json_loads(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("gap") / "train-000001.jsonl"
    text = "\n".join(lines)
    path.write_text(text, encoding="utf-8")
    got = _core.read_gap_records(path)
    want = reference(text)
    assert [s for s, _ in got] == [s for s, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert sorted(a) == sorted(b)
        assert all(same(a[k], b[k]) for k in a)


# -- the committed monitored run (no torch needed) --------------------------------------

FIXTURE = Path(__file__).resolve().parents[1] / "rust" / "testdata" / "logs" / "gap_monitored"


def test_the_committed_monitored_run_is_judged_by_scan_and_by_the_probe():
    """``rust/testdata/logs/gap_monitored``: ``monitored_run(steps=30,
    nan_at=20)`` below, written by the real monitor. A scan gives it a
    gap_monitor record, the same as the probe's."""
    single = ap.gap_monitor(FIXTURE)
    assert single.verdict == "fail" and single.evidence["nonfinite_step"] == 22
    report = ap.scan(FIXTURE)
    (record,) = [r for r in report.records if r.probe == "gap_monitor"]
    assert (record.verdict, record.message) == (single.verdict, single.message)
    assert [r.probe for r in report.records if r.adapter is None] == [
        "gap_monitor",
        "training_drift",
    ]


def test_the_report_draws_each_layers_gradient_norm_with_names_escaped(tmp_path):
    from adapterprobe.reports.html import render_html

    page = render_html(ap.scan(FIXTURE).records)
    assert "Gradient norm per layer" in page
    assert page.count('<path class="layer') == 4  # layers.0 .. layers.3
    # a hostile layer name in the records reaches the page escaped
    store = tmp_path / "hostile"
    (store / "logs").mkdir(parents=True)
    text = (FIXTURE / "logs").glob("*.jsonl").__next__().read_text()
    evil = "<script>alert(1)</script>"
    (store / "logs" / "train-000001.jsonl").write_text(text.replace("layers.2", evil))
    page = render_html(ap.scan(store).records)
    assert evil not in page and "&lt;script&gt;" in page


# -- faults training produces, in a monitored plain loop --------------------------------

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    """Four tanh layers and a head; ``dead`` gives layer 1 a ReLU whose bias
    keeps every unit off, so it and the layers before it get no gradient."""

    def __init__(self, dead: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(4)])
        self.head = torch.nn.Linear(16, 1)
        self.dead = dead
        if dead:
            with torch.no_grad():
                self.layers[1].bias.fill_(-100.0)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x)) if self.dead and i == 1 else torch.tanh(layer(x))
        return self.head(x)


def monitored_run(
    store: Path,
    *,
    steps: int = 100,
    lr: float = 0.01,
    dead: bool = False,
    nan_at: int | None = None,
    lr_growth: float = 1.0,
    hook_from: int | None = None,
) -> Path:
    """SGD on a regression with the monitor writing into ``store/logs``;
    the lr is multiplied by ``lr_growth`` each step; ``nan_at`` writes a NaN
    into one weight after that step's update (a corrupted update);
    ``hook_from`` registers a buggy gradient hook on layer 2 that multiplies
    its gradient by 1000 from that step on."""
    from adapterprobe import GAPMonitor
    from adapterprobe.sinks import JsonlSink

    torch.manual_seed(0)
    net = Net(dead)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    monitor = GAPMonitor(net, interval=2, sink=JsonlSink.for_store(store, run_id=1))
    gen = torch.Generator().manual_seed(1)
    now = {"step": 0}
    if hook_from is not None:
        for param in net.layers[2].parameters():
            param.register_hook(lambda g: g * 1000.0 if now["step"] >= hook_from else g)
    for step in range(1, steps + 1):
        now["step"] = step
        x = torch.randn(32, 16, generator=gen)
        with monitor.step(step):
            loss = torch.nn.functional.mse_loss(net(x), 2 * x[:, :1])
            loss.backward()
        opt.step()
        opt.zero_grad()
        for group in opt.param_groups:
            group["lr"] *= lr_growth
        if step == nan_at:
            with torch.no_grad():
                net.layers[3].weight[0, 0] = float("nan")
        monitor.log_step(step, loss.item())
    monitor.close()
    return store


def rules_of(result: ap.ProbeResult) -> set[str]:
    return {f["rule"] for f in result.evidence["findings"]}


def test_a_healthy_monitored_run_passes(tmp_path):
    result = ap.gap_monitor(monitored_run(tmp_path / "healthy"))
    assert result.verdict == "pass", result.message
    plot = result.evidence["layer_grad_norms"]
    assert sorted(plot) == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert [s for s, _ in plot["layers.0"]] == list(range(2, 101, 2))


def test_a_dead_relu_layer_warns_of_vanishing_gradients(tmp_path):
    result = ap.gap_monitor(monitored_run(tmp_path / "dead", dead=True))
    assert result.verdict == "warn", result.message
    assert rules_of(result) == {"vanishing_grads"}
    assert {"layers.0", "layers.1"} <= set(result.evidence["vanishing_layers"])
    assert "layers.3" not in result.evidence["vanishing_layers"]


def test_a_weight_gone_nan_fails_naming_the_step_and_tensor(tmp_path):
    result = ap.gap_monitor(monitored_run(tmp_path / "nan", nan_at=40))
    assert result.verdict == "fail", result.message
    assert result.evidence["nonfinite_step"] == 42  # the first sampled step after it
    assert result.evidence["nonfinite_kind"] == "params"
    assert "layers.3" in result.evidence["nonfinite_tensors"]
    assert "step 42" in result.message and "layers.3" in result.message


def test_a_buggy_gradient_hook_on_one_layer_is_an_exploding_layer(tmp_path):
    """From step 50 a hook multiplies layer 2's gradient by 1000 (a loss
    scale applied to one module): the rule names that layer and the step."""
    result = ap.gap_monitor(monitored_run(tmp_path / "hook", hook_from=50))
    assert result.verdict == "fail", result.message
    assert result.evidence["exploding_layer"] == "layers.2"
    assert result.evidence["exploding_step"] == 50
    assert "layers.2" in result.message and "step 50" in result.message


def test_a_climbing_lr_that_blows_up_the_activations_warns(tmp_path):
    result = ap.gap_monitor(monitored_run(tmp_path / "climb", lr=0.01, lr_growth=1.08))
    assert "activations_growing" in rules_of(result) or "nonfinite" in rules_of(result), (
        result.message
    )
    assert result.verdict in ("warn", "fail")


def test_options_move_the_verdict_both_ways(tmp_path):
    store = monitored_run(tmp_path / "dead", dead=True)
    assert ap.gap_monitor(store, vanish_share=1.0).verdict == "pass"
    assert ap.gap_monitor(store, min_samples=1000).verdict == "pass"
    with pytest.raises(ap.UsageError):
        ap.gap_monitor(store, vanish_share=2.0)


def test_a_store_without_gap_records_is_a_skip_and_gets_no_scan_record(corpus):
    root, _ = corpus
    store = root / "healthy-all7-5l"
    assert ap.gap_monitor(store).verdict == "skip"
    report = ap.scan(store)
    assert "gap_monitor" not in {r.probe for r in report.records}


# -- the monitor's logs/ in an HF Trainer output dir ------------------------------------


def test_a_trainer_output_dir_with_the_monitors_logs_keeps_its_checkpoints(tmp_path):
    transformers = pytest.importorskip("transformers")
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    from adapterprobe import GAPMonitor
    from adapterprobe.integrations.transformers import GAPCallback
    from adapterprobe.sinks import JsonlSink

    out = tmp_path / "run"
    torch.manual_seed(0)
    model = tiny_llama()
    monitor = GAPMonitor(model, interval=2, sink=JsonlSink.for_store(out, run_id=1))
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=12,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=3e-3,
            save_steps=6,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(64, 8, 64),
        callbacks=[GAPCallback(monitor)],
    )
    trainer.train()
    monitor.close()
    report = ap.scan(out)
    by_probe = {(r.probe, Path(r.adapter).name if r.adapter else None) for r in report.records}
    assert {r.layout for r in report.records} == {"hf-trainer"}
    assert ("gap_monitor", None) in by_probe
    assert ("training_drift", None) in by_probe
    assert ("adapter_weights", "checkpoint-12") in by_probe
    gap = next(r for r in report.records if r.probe == "gap_monitor")
    assert gap.verdict == "pass", gap.message
