"""Rust curve kernels against the plain-Python seed reference (hypothesis)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import seed_reference as ref
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import adapterprobe as ap

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
any_float = st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0]))


def rel_close(a: float, b: float, tol: float = 1e-9) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol * max(abs(a), abs(b)) or a == b


@settings(max_examples=400, deadline=None)
@given(
    deltas=st.lists(any_float, max_size=80),
    window=st.integers(min_value=1, max_value=25),
    sigma=st.floats(min_value=0.1, max_value=10),
)
def test_spikes_match_reference(deltas, window, sigma):
    arr = np.array(deltas, dtype=np.float64)
    want = ref.count_spikes(arr, window, sigma)
    assert ap.spike_indices(arr, window=window, sigma=sigma).tolist() == want
    assert ap.count_spikes(deltas, window=window, sigma=sigma) == len(want)


@settings(max_examples=60, deadline=None)
@given(
    deltas=st.lists(st.floats(min_value=-1, max_value=1), min_size=200, max_size=2000),
    window=st.integers(min_value=2, max_value=60),
)
def test_spikes_match_reference_on_long_curves(deltas, window):
    arr = np.array(deltas)
    assert ap.spike_indices(arr, window=window).tolist() == ref.count_spikes(arr, window, 3.0)


@settings(max_examples=400, deadline=None)
@given(
    losses=st.lists(any_float, min_size=1, max_size=120),
    window=st.integers(min_value=2, max_value=20),
    sigma=st.floats(min_value=0.5, max_value=6),
)
def test_curve_metrics_match_reference(losses, window, sigma):
    got = ap.curve_metrics(np.array(losses), rolling_window=window, spike_sigma=sigma)
    want = ref.curve_metrics(np.array(losses), window, sigma)
    for key, value in want.items():
        assert rel_close(float(got[key]), value), (key, got[key], value)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=10), min_size=2, max_size=3000))
def test_curve_metrics_bit_exact_on_long_finite_curves(losses):
    got = ap.curve_metrics(losses)
    want = ref.curve_metrics(np.array(losses), 10, 3.0)
    assert got["smoothness"] == want["smoothness"]
    assert got["instability_events"] == want["instability_events"]


def test_spike_points_are_the_later_point_of_each_rise():
    losses = [5, 4.9, 4.8, 4.7, 4.6, 4.5, 9.0, 4.4, 4.3, 4.2, 4.1, 4.0, 3.9]
    m = ap.curve_metrics(losses)
    assert m["spike_points"].tolist() == [6]
    assert m["instability_events"] == 1


@pytest.mark.parametrize("bad", [{"window": 0}, {"sigma": 0.0}, {"sigma": math.nan}])
def test_kernel_arguments_are_checked(bad):
    with pytest.raises(ap.UsageError):
        ap.count_spikes([1.0, 2.0], **bad)


def test_non_numeric_input_is_a_usage_error():
    with pytest.raises(ap.UsageError):
        ap.curve_metrics(["a", "b"])


# --- log reading -----------------------------------------------------------

scalar_json = st.one_of(st.integers(-5, 5), finite, st.booleans(), st.none(), st.text(max_size=6))
nested = st.recursive(
    scalar_json,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def log_line(draw):
    """One line as some writer might produce it, plus the hazards dlm logs show."""
    kind = draw(st.sampled_from(["step", "step", "step", "banner", "event", "nested", "junk"]))
    if kind == "junk":
        return draw(
            st.sampled_from(["", "   ", "{", '{"type": "step", "step": 1', "[1,2]", "null", "x"])
        )
    record: dict = {"type": "step" if kind in ("step", "nested") else kind}
    if kind == "step":
        step = draw(
            st.one_of(st.integers(-3, 60), st.integers(0, 60).map(float), st.text(max_size=3))
        )
        record["step"] = step
        loss = draw(
            st.one_of(
                any_float, st.integers(0, 9), st.none(), st.sampled_from(["1.5", "nan", " 2 "])
            )
        )
        if draw(st.booleans()) or loss is not None:
            record["loss"] = loss
    else:
        record["plan"] = {"type": "step", "step": 3, "loss": 1.0, "x": draw(nested)}
        if kind == "nested":
            record["type"] = "banner"
            record["note"] = '"type": "step"'
    if draw(st.booleans()):
        record["lr"] = draw(finite)
    items = list(record.items())
    if draw(st.booleans()):
        items = draw(st.permutations(items))
    separators = draw(st.sampled_from([(", ", ": "), (",", ":"), (" ,  ", " :\t")]))
    text = json.dumps(dict(items), separators=separators, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        text = text.replace('"type"', '"typ\\u0065"')
    # Python's str.strip() also removes Unicode whitespace around a line.
    pad = st.sampled_from(["", " ", "\t", "\u00a0", "\u3000", "\u2028 ", "\u205f"])
    return draw(pad) + text + draw(pad)


@st.composite
def log_file(draw):
    lines = draw(st.lists(log_line(), max_size=25))
    first = json.dumps({"type": "banner", "run_id": 1, "plan": {"type": "step"}})
    if draw(st.integers(0, 9)) == 0:
        first = draw(st.sampled_from(["", "{bad", "   "]))
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    body = ending.join([first, *lines])
    if draw(st.booleans()):
        body += ending
    elif draw(st.booleans()):
        body += ending + '{"loss": 1.2, "step": 9'  # torn tail
    return body


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(files=st.lists(log_file(), min_size=1, max_size=3))
def test_read_loss_curve_matches_reference(tmp_path_factory, files):
    logs = tmp_path_factory.mktemp("store") / "logs"
    logs.mkdir()
    paths = []
    for i, body in enumerate(files):
        path = logs / f"train-{i:06d}-20250101T0000{i:02d}.jsonl"
        path.write_bytes(body.encode("utf-8"))
        paths.append(path)
    try:
        want = ref.collect_steps(paths)
    except ref.ReferenceLogError:
        with pytest.raises(ap.LogFormatError, match="first line"):
            ap.read_loss_curve(logs.parent)
        return
    assume(all(isinstance(k, int) for k in want))
    curve = ap.read_loss_curve(logs.parent)
    ordered = sorted(want.items())
    assert curve.steps.tolist() == [s for s, _ in ordered]
    assert curve.losses.tolist() == [v for _, v in ordered]
    assert curve.num_files == len(files)
    assert curve.steps.dtype == np.int64 and curve.losses.dtype == np.float64


def test_sources_dir_file_and_list(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    line = '{{"loss": {l}, "step": {s}, "type": "step"}}\n'
    (logs / "train-000001-20250101T000000.jsonl").write_text(
        line.format(l=3, s=1) + line.format(l=2, s=2)
    )
    (logs / "train-000002-20250102T000000.jsonl").write_text(line.format(l=2.5, s=2))
    (logs / "notes.txt").write_text("ignored")
    by_store = ap.read_loss_curve(tmp_path)
    by_logs = ap.read_loss_curve(str(logs))
    files = sorted(logs.glob("train-*.jsonl"), reverse=True)  # order given does not matter
    by_list = ap.read_loss_curve(files)
    for curve in (by_store, by_logs, by_list):
        assert curve.steps.tolist() == [1, 2]
        assert curve.losses.tolist() == [3.0, 2.5]
        assert curve.num_files == 2
    one = ap.read_loss_curve(files[0])
    assert one.steps.tolist() == [2] and one.num_files == 1


def test_nan_and_infinity_tokens_are_stored_as_inf(tmp_path):
    path = tmp_path / "train-1.jsonl"
    path.write_text(
        '{"type": "banner"}\n'
        '{"loss": NaN, "step": 1, "type": "step"}\n'
        '{"loss": -Infinity, "step": 2.0, "type": "step"}\n'
        '{"loss": Infinity, "step": 3, "type": "step"}\n'
    )
    curve = ap.read_loss_curve(path)
    assert curve.steps.tolist() == [1, 2, 3]
    assert curve.losses.tolist() == [math.inf] * 3


def test_missing_source_and_directory_as_file(tmp_path):
    with pytest.raises(ap.AdapterProbeError):
        ap.read_loss_curve(tmp_path / "nope")
    (tmp_path / "train-1.jsonl").mkdir()
    with pytest.raises(ap.LogFormatError, match="directory"):
        ap.read_loss_curve([tmp_path / "train-1.jsonl"])
