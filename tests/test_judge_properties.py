"""No judge divides by a value it did not check: every rule of both rule sets
gets arbitrary finite and non-finite values and must answer with a verdict,
never an exception (``guarded`` would hide one as an ``error`` record, so the
judges are called directly here).

The loss curve alone is covered by ``test_drift_rules``; here the side
series of a real ``trainer_state.json`` (``eval_loss``, ``grad_norm``,
``learning_rate``) get arbitrary values too, and ``gradient_ghost``'s rules
get arbitrary second moments over layers attributed like a real adapter's.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapterprobe as ap
from adapterprobe.probes.ghost import GhostOptions, judge_ghost
from adapterprobe.probes.result import Verdict

REAL_STATE = Path(__file__).parents[1] / "rust/testdata/logs/hf_run/trainer_state.json"

value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, 1e-300, -1e-300, 1e300, -1.0, math.nan, math.inf, -math.inf]),
)
VERDICTS = {v.value for v in Verdict} - {"error"}


def _assert_answer(result) -> None:
    assert result.verdict.value in VERDICTS, result.message
    assert "failed while judging" not in result.message
    json.dumps(result.to_dict(), allow_nan=False)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), rules=st.sampled_from(["robust", "sway"]))
def test_drift_side_series_of_any_value(tmp_path_factory, data, rules):
    state = json.loads(REAL_STATE.read_text())
    for entry in state["log_history"]:
        for key in ("loss", "grad_norm", "learning_rate", "eval_loss"):
            if key in entry:
                entry[key] = data.draw(value, label=f"{key}@{entry['step']}")
    store = tmp_path_factory.mktemp("hf")
    shutil.copytree(REAL_STATE.parent / "runs", store / "runs")
    (store / "trainer_state.json").write_text(json.dumps(state, indent=2))
    _assert_answer(ap.training_drift(store, rules=rules))


@settings(max_examples=300, deadline=None)
@given(
    layers=st.integers(1, 8),
    slots=st.integers(1, 4),
    step=st.integers(0, 10_000),
    data=st.data(),
    rules=st.sampled_from(["robust", "sway"]),
)
def test_ghost_rules_on_any_second_moments(layers, slots, step, data, rules):
    n = layers * slots
    means = data.draw(st.lists(value, min_size=n, max_size=n), label="means")
    nonfinite = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n), label="nonfinite")
    per_param = [
        SimpleNamespace(param_id=i, exp_avg_sq_mean=m, nonfinite=k, numel=16, shape=[4, 4])
        for i, (m, k) in enumerate(zip(means, nonfinite, strict=True))
    ]
    # Shaped like the Rust attribution of a LoRA adapter: layer-major ids,
    # the same slots (module, factor) in every layer.
    layer_indices = list(range(0, 2 * layers, 2))
    attribution = SimpleNamespace(
        layer_indices=layer_indices,
        params=[
            SimpleNamespace(param_id=i, layer=layer_indices[i // slots], slot=i % slots)
            for i in range(n)
        ],
        slot_names=[f"layers.N.mlp.proj{j}.lora_A" for j in range(slots)],
        unattributed=[],
    )
    grouping = SimpleNamespace(
        layer_indices=tuple(layer_indices),
        layer_of={i: layer_indices[i // slots] for i in range(n)},
        num_layers=layers,
        params_per_layer=slots,
    )
    state = SimpleNamespace(
        global_step=step,
        epoch=1.0,
        best_val_loss=math.nan,
        use_qlora=False,
        per_param=per_param,
        implausible=[],
    )
    inputs = SimpleNamespace(
        state=state,
        grouping=grouping,
        grouping_error=None,
        attribution=attribution,
        attribution_error=None,
        weights_error=None,
        error=None,
        note=None,
        optimizer="adam",
    )
    _assert_answer(judge_ghost(inputs, GhostOptions(rules=rules)))
