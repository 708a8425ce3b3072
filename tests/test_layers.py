"""group_layers against the reference mapping, on real safetensors files."""

from __future__ import annotations

import pytest
import seed_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import adapterprobe as ap

safetensors_numpy = pytest.importorskip("safetensors.numpy")
np = pytest.importorskip("numpy")


def write_adapter(path, keys):
    tensors = {k: np.zeros((1, 1), dtype=np.float32) for k in keys}
    safetensors_numpy.save_file(tensors, str(path))
    return path


def peft_keys(layers, modules=("q_proj", "v_proj")):
    return [
        f"base_model.model.model.layers.{layer}.self_attn.{m}.{f}.weight"
        for layer in layers
        for m in modules
        for f in ("lora_A", "lora_B")
    ]


def test_dir_and_file_inputs(tmp_path):
    write_adapter(
        tmp_path / "adapter_model.safetensors",
        [*peft_keys([0, 1, 2]), "base_model.model.lm_head.weight"],
    )
    for source in (tmp_path, tmp_path / "adapter_model.safetensors", str(tmp_path)):
        g = ap.group_layers(source, num_params=13)
        assert g.layer_indices == (0, 1, 2)
        assert g.params_per_layer == 4
        assert g.num_layers == 3
        assert g.layer_of == {p: p // 4 for p in range(12)}


def test_refusals(tmp_path):
    with pytest.raises(ap.LayerGroupingError, match="not found"):
        ap.group_layers(tmp_path)
    write_adapter(tmp_path / "adapter_model.safetensors", peft_keys([0, 1]))
    with pytest.raises(ap.LayerGroupingError, match="do not match"):
        ap.group_layers(tmp_path, num_params=7)
    write_adapter(tmp_path / "adapter_model.safetensors", ["base_model.model.lm_head.weight"])
    with pytest.raises(ap.LayerGroupingError, match="layers"):
        ap.group_layers(tmp_path)
    write_adapter(tmp_path / "adapter_model.safetensors", [*peft_keys([0, 1]), "m.layers.1.mlp.w"])
    with pytest.raises(ap.LayerGroupingError, match="different"):
        ap.group_layers(tmp_path, rules="sway")
    with pytest.raises(ap.LayerGroupingError, match="several layer stacks"):
        ap.group_layers(tmp_path)
    extra = "base_model.model.model.layers.1.mlp.w"
    write_adapter(tmp_path / "adapter_model.safetensors", [*peft_keys([0, 1]), extra])
    with pytest.raises(ap.LayerGroupingError, match="different"):
        ap.group_layers(tmp_path)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\x01")
    with pytest.raises(ap.HeaderError):
        ap.group_layers(tmp_path)


segment = st.sampled_from(
    ["layers", "layer", "h", "0", "12", "q_proj", "lora_A", "weight", "", "x1"]
)
key = st.lists(segment, min_size=1, max_size=7).map(".".join)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(key, min_size=1, max_size=20, unique=True),
    num_params=st.one_of(st.none(), st.integers(0, 30)),
)
def test_matches_reference(tmp_path_factory, keys, num_params):
    path = write_adapter(tmp_path_factory.mktemp("a") / "adapter_model.safetensors", keys)
    try:
        want = ref.group_layers(keys, num_params)
    except ref.ReferenceGroupingError:
        with pytest.raises(ap.LayerGroupingError):
            ap.group_layers(path, num_params=num_params, rules="sway")
        return
    got = ap.group_layers(path, num_params=num_params, rules="sway")
    assert (got.layer_indices, got.params_per_layer, got.layer_of) == want


ROBUST_MARKERS = {"layers", "h", "layer", "block", "blocks"}
U64_MAX = 2**64 - 1


def robust_grouping(keys: list[str], num_params: int | None):
    """rules="robust" in plain Python: a key's layer is the first
    ``<marker>.<ASCII digits>`` with something after it (an index past u64
    makes the key unlayered); all layered keys share one stack (the text
    before the index); then the seed's counting."""
    counts: dict[int, int] = {}
    stacks = set()
    for key in keys:
        parts = key.split(".")
        for i in range(1, len(parts) - 1):
            digits = parts[i]
            if parts[i - 1] in ROBUST_MARKERS and digits and all(c in "0123456789" for c in digits):
                if int(digits) <= U64_MAX:
                    stacks.add(".".join(parts[:i]))
                    counts[int(digits)] = counts.get(int(digits), 0) + 1
                break
    if not keys or not counts or len(stacks) > 1 or len(set(counts.values())) != 1:
        raise ref.ReferenceGroupingError("refused")
    per_layer = next(iter(counts.values()))
    layers = tuple(sorted(counts))
    expected = per_layer * len(layers)
    if num_params is not None and num_params < expected:
        raise ref.ReferenceGroupingError("fewer params")
    return layers, per_layer, {p: layers[p // per_layer] for p in range(expected)}


robust_segment = st.sampled_from(
    ["model", "transformer", "layers", "h", "block", "0", "3", "12", "q_proj", "lora_A", ""]
)
robust_key = st.lists(robust_segment, min_size=1, max_size=6).map(".".join)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(robust_key, min_size=1, max_size=20, unique=True),
    num_params=st.one_of(st.none(), st.integers(0, 30)),
)
def test_robust_rule_matches_its_reference(tmp_path_factory, keys, num_params):
    path = write_adapter(tmp_path_factory.mktemp("a") / "adapter_model.safetensors", keys)
    try:
        want = robust_grouping(keys, num_params)
    except ref.ReferenceGroupingError:
        with pytest.raises(ap.LayerGroupingError):
            ap.group_layers(path, num_params=num_params)
        return
    got = ap.group_layers(path, num_params=num_params)
    assert (got.layer_indices, got.params_per_layer, got.layer_of) == want
