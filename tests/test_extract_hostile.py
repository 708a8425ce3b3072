"""Hostile JSON beside real checkpoints and libraries: config.json, the shard index and
the parasitic library.json, each mutated from a file the real tools wrote. Every one
must be an ExtractionError naming the file, never a bare Python exception, and no
entry may reach a file outside its own directory."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import adapterprobe  # noqa: E402
from adapterprobe import ExtractionError, ParasiticConfig, ParasiticExtractor  # noqa: E402
from adapterprobe.lora.parasitic import AdapterLibrary  # noqa: E402
from realruns.tiny import finetune, tiny_gpt2, tiny_llama  # noqa: E402

DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit in json.loads


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A real base/tuned pair saved by transformers, the tuned one sharded."""
    root = tmp_path_factory.mktemp("ckpt")
    base = tiny_gpt2(0, hidden=32)
    tuned = finetune(base, steps=3)
    base.save_pretrained(root / "base")
    tuned.save_pretrained(root / "tuned", max_shard_size="20KB")
    assert (root / "tuned" / "model.safetensors.index.json").is_file()
    return root


def copy_pair(checkpoints, tmp_path):
    shutil.copytree(checkpoints / "base", tmp_path / "base")
    shutil.copytree(checkpoints / "tuned", tmp_path / "tuned")
    return tmp_path / "base", tmp_path / "tuned"


def extract(base, tuned, out):
    return adapterprobe.extract_lora(base, tuned, out, min_rank=1, max_rank=4)


def test_the_unmutated_pair_extracts(checkpoints, tmp_path):
    base, tuned = copy_pair(checkpoints, tmp_path)
    assert extract(base, tuned, tmp_path / "o").num_modules == 8


# -- config.json: each case once raised the Python error named in its id ---------------

CONFIGS = {
    "TypeError": lambda cfg: {**cfg, "model_type": ["gpt2"]},  # unhashable in a set lookup
    "RecursionError": lambda cfg: DEEP,
    "AttributeError": lambda cfg: [cfg],  # .get on a list
    "ValueError": lambda cfg: "{not json",
    "KeyError-free-nonsense": lambda cfg: {**cfg, "tie_word_embeddings": "yes"},
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_hostile_config_json_is_an_extraction_error(checkpoints, tmp_path, case):
    base, tuned = copy_pair(checkpoints, tmp_path)
    path = tuned / "config.json"
    mutated = CONFIGS[case](json.loads(path.read_text()))
    path.write_text(mutated if isinstance(mutated, str) else json.dumps(mutated))
    with pytest.raises(ExtractionError, match=r"config\.json") as err:
        extract(base, tuned, tmp_path / "o")
    assert err.value.path == str(path)
    assert not (tmp_path / "o").exists()


def test_config_json_that_is_not_utf8_or_too_large(checkpoints, tmp_path, monkeypatch):
    from adapterprobe.lora import sources

    base, tuned = copy_pair(checkpoints, tmp_path)
    (tuned / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    with pytest.raises(ExtractionError, match=r"config\.json"):
        extract(base, tuned, tmp_path / "o")
    (tuned / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    monkeypatch.setattr(sources, "MAX_JSON_BYTES", 10)
    with pytest.raises(ExtractionError, match="allowed"):
        extract(base, tuned, tmp_path / "o")


# -- the shard index ---------------------------------------------------------------------

INDEXES = {
    "KeyError": lambda idx: {"metadata": idx["metadata"]},  # no weight_map
    "TypeError": lambda idx: [idx],  # a list where an object belongs
    "RecursionError": lambda idx: DEEP,
    "ValueError": lambda idx: '{"weight_map": {',
    "AttributeError": lambda idx: {**idx, "weight_map": ["model.safetensors"]},
    "shard-not-a-name": lambda idx: {
        **idx,
        "weight_map": {k: 7 for k in idx["weight_map"]},
    },
}


@pytest.mark.parametrize("case", sorted(INDEXES))
def test_hostile_index_is_an_extraction_error(checkpoints, tmp_path, case):
    base, tuned = copy_pair(checkpoints, tmp_path)
    path = tuned / "model.safetensors.index.json"
    mutated = INDEXES[case](json.loads(path.read_text()))
    path.write_text(mutated if isinstance(mutated, str) else json.dumps(mutated))
    with pytest.raises(ExtractionError, match="sharded index") as err:
        extract(base, tuned, tmp_path / "o")
    assert err.value.path == str(path)


@pytest.mark.parametrize("escape", ["absolute", "dotdot", "dotdot-inside"])
def test_index_entries_cannot_leave_their_directory(checkpoints, tmp_path, escape):
    base, tuned = copy_pair(checkpoints, tmp_path)
    path = tuned / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    key, shard = next(iter(index["weight_map"].items()))
    # a real shard, moved where the hostile entry points: reading it would "work"
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(tuned / shard, outside)
    target = {
        "absolute": str(outside),
        "dotdot": "../elsewhere.safetensors",
        "dotdot-inside": f"sub/../../{outside.name}",
    }[escape]
    index["weight_map"][key] = target
    path.write_text(json.dumps(index))
    with pytest.raises(ExtractionError, match="outside the index's directory") as err:
        extract(base, tuned, tmp_path / "o")
    assert err.value.tensor == key


def test_index_entry_inside_a_subdirectory_is_fine(checkpoints, tmp_path):
    base, tuned = copy_pair(checkpoints, tmp_path)
    path = tuned / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (tuned / "shards").mkdir()
    shutil.move(tuned / shard, tuned / "shards" / shard)
    index["weight_map"] = {
        k: (f"shards/./{v}" if v == shard else v) for k, v in index["weight_map"].items()
    }
    path.write_text(json.dumps(index))
    assert extract(base, tuned, tmp_path / "o").num_modules == 8


# -- the parasitic library -----------------------------------------------------------------


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """A real library: a tiny Llama trained for real, two adapters extracted on the way."""
    model = tiny_llama(0, tie_word_embeddings=False)
    px = ParasiticExtractor(ParasiticConfig(min_rank=1, max_rank=4, interval_steps=2))
    px.snapshot_base(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    for step in range(1, 5):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if px.should_extract(step, loss.item()):
            px.extract(model, step, {"loss": loss.item()})
    root = tmp_path_factory.mktemp("lib") / "library"
    px.save_library(root)
    assert len(AdapterLibrary.load_library(root)) == 2
    return root


def first_entry(data):
    return data["adapters"][0]


def set_in_entry(field, value):
    def mutate(data):
        data = copy.deepcopy(data)
        first_entry(data)[field] = value
        return data

    return mutate


def set_layer_meta(value):
    def mutate(data):
        data = copy.deepcopy(data)
        layers = first_entry(data)["layers"]
        layers[next(iter(layers))] = value
        return data

    return mutate


LIBRARIES = {
    "KeyError": lambda d: {
        **d,
        "adapters": [{k: v for k, v in first_entry(d).items() if k != "file"}],
    },
    "TypeError": lambda d: {**d, "adapters": 5},
    "TypeError-entry": lambda d: {**d, "adapters": [["adapter-0000.safetensors"]]},
    "AttributeError": set_layer_meta("rank 3"),
    "ValueError": set_in_entry("step", float("nan")),
    "ValueError-seconds": set_in_entry("seconds", "fast"),
    "OverflowError": set_in_entry("step", float("inf")),
    "RecursionError": lambda d: DEEP,
    "config-types": lambda d: {**d, "config": {"min_rank": "8"}},
    "not-an-object": lambda d: [d],
}


@pytest.mark.parametrize("case", sorted(LIBRARIES))
def test_hostile_library_json_is_an_extraction_error(library, tmp_path, case):
    root = tmp_path / "library"
    shutil.copytree(library, root)
    path = root / "library.json"
    mutated = LIBRARIES[case](json.loads(path.read_text()))
    # json.dumps writes NaN/Infinity tokens, which Python's json reads back
    path.write_text(mutated if isinstance(mutated, str) else json.dumps(mutated))
    with pytest.raises(ExtractionError, match="adapter library") as err:
        AdapterLibrary.load_library(root)
    assert err.value.path == str(path)


@pytest.mark.parametrize("escape", ["absolute", "dotdot"])
def test_library_entries_cannot_leave_their_directory(library, tmp_path, escape):
    root = tmp_path / "library"
    shutil.copytree(library, root)
    shutil.copy(root / "adapter-0000.safetensors", tmp_path / "stolen.safetensors")
    path = root / "library.json"
    data = json.loads(path.read_text())
    first_entry(data)["file"] = (
        str(tmp_path / "stolen.safetensors") if escape == "absolute" else "../stolen.safetensors"
    )
    path.write_text(json.dumps(data))
    with pytest.raises(ExtractionError, match="not a file name inside the library"):
        AdapterLibrary.load_library(root)


def test_library_adapter_file_cut_short_or_with_bad_shapes(library, tmp_path):
    from safetensors.torch import load_file, save_file

    root = tmp_path / "library"
    shutil.copytree(library, root)
    adapter = root / "adapter-0000.safetensors"
    tensors = load_file(adapter)
    name = next(k for k in tensors if k.endswith("::lora_A"))
    tensors[name] = tensors[name][:, :-1].T.contiguous()  # no longer multiplies with B
    save_file(tensors, adapter)
    with pytest.raises(ExtractionError, match="do not multiply"):
        AdapterLibrary.load_library(root)
    adapter.write_bytes(adapter.read_bytes()[:100])
    with pytest.raises(ExtractionError, match="cannot read adapter-0000"):
        AdapterLibrary.load_library(root)
