"""extract_lora on real fine-tunes (every parameter trained): how much of the fine-tune
the PEFT-loaded adapter reproduces, by category and by measured logits."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

import adapterprobe  # noqa: E402
from adapterprobe import UsageError  # noqa: E402
from adapterprobe.lora.report import POOR_RECOVERY  # noqa: E402
from realruns.tiny import finetune, tiny_gpt2, tiny_llama  # noqa: E402

FULL_RANK = dict(min_rank=1, max_rank=4096, explained_variance=1.0)
MODELS = {
    "llama": lambda: tiny_llama(0, hidden=64, vocab=96, tie_word_embeddings=False),
    "llama-tied": lambda: tiny_llama(0, hidden=64, vocab=96, tie_word_embeddings=True),
    "gpt2": lambda: tiny_gpt2(0, hidden=48, vocab=96),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each model and its real full fine-tune, in memory and saved with save_pretrained."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, build in MODELS.items():
            base = build().eval()
            tuned = finetune(base)
            root = tmp_path_factory.mktemp(name)
            base.save_pretrained(root / "base")
            tuned.save_pretrained(root / "tuned")
            out[name] = (base, tuned, root)
    return out


def extract(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's and transformers' advice while verifying
        return adapterprobe.extract_lora(*args, **kwargs)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("source", ["module", "path"])
def test_full_rank_recovers_the_whole_fine_tune(runs, tmp_path, name, source):
    base, tuned, root = runs[name]
    args = (base, tuned) if source == "module" else (root / "base", root / "tuned")
    rep = extract(*args, tmp_path / "lora", embeddings="save", verify=True, **FULL_RANK)
    assert rep.logit_change_recovered >= 0.99
    assert rep.verification["top1_agreement"] == 1.0
    assert rep.energy_captured == pytest.approx(1.0, abs=1e-6)
    for category in ("linear", "embedding", "1-D"):
        assert rep.categories[category].changed > 0, category
        assert rep.categories[category].captured == pytest.approx(1.0, abs=1e-6), category
    assert rep.missed_changes == []
    saved = json.loads((tmp_path / "lora" / "extraction_report.json").read_text())
    assert saved["verification"]["logit_change_recovered"] == rep.logit_change_recovered
    assert saved["categories"]["1-D"]["captured"] == pytest.approx(1.0)


def test_tied_head_is_saved_under_both_names_and_loads_tuned(runs, tmp_path):
    base, tuned, root = runs["gpt2"]
    assert tuned.lm_head.weight.data_ptr() == tuned.transformer.wte.weight.data_ptr()
    rep = extract(root / "base", root / "tuned", tmp_path / "lora", embeddings="save", **FULL_RANK)
    assert rep.tied == {"lm_head": "transformer.wte"}
    cfg = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert cfg["ensure_weight_tying"] is True
    assert {"lm_head", "transformer.wte", "transformer.wpe", "transformer.ln_f"} <= set(
        cfg["modules_to_save"]
    )
    assert cfg["bias"] == "lora_only" and cfg["fan_in_fan_out"] is True
    sd = load_file(tmp_path / "lora" / "adapter_model.safetensors")
    head = sd["base_model.model.lm_head.weight"]
    assert torch.equal(head, sd["base_model.model.transformer.wte.weight"])
    assert torch.equal(head, tuned.transformer.wte.weight)
    bias = sd["base_model.model.transformer.h.1.mlp.c_fc.base_layer.bias"]
    assert torch.equal(bias, tuned.transformer.h[1].mlp.c_fc.bias)
    # what PEFT loads: the head follows the saved embedding, not the base one
    peft = pytest.importorskip("peft")
    import copy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path / "lora"))
    assert torch.equal(pm.get_output_embeddings().weight, tuned.lm_head.weight)


def test_default_rank_and_defaults_report_what_they_leave_out(runs, tmp_path):
    base, tuned, _ = runs["llama"]
    saved = extract(base, tuned, tmp_path / "save", embeddings="save", verify=True)
    plain = extract(base, tuned, tmp_path / "plain", verify=2)
    assert saved.energy_kept >= 0.95 - 1e-3  # the rank rule: 95% of each delta's energy
    assert 0.5 < saved.logit_change_recovered < 0.999  # truncation costs something
    embedding = plain.categories["embedding"]
    assert embedding.changed == 2 and embedding.missed == 2 and embedding.captured == 0.0
    assert plain.categories["1-D"].captured == 1.0  # norms saved by default
    assert plain.logit_change_recovered < saved.logit_change_recovered
    assert plain.verification["batches"] == 2
    text = str(plain)
    assert "embeddings='save' (--embeddings save) carries them" in text
    assert "logit change recovered" in text
    missed = {s.name: s.reason for s in plain.missed_changes}
    assert missed["model.embed_tokens.weight"] == "embedding or output head (embeddings='skip')"
    # A poor verification with changed embeddings left out is said, naming
    # the option (issue 56, item 5); the rule is held to its threshold here,
    # whatever this machine's training recovered.
    poor = POOR_RECOVERY - 0.01
    plain.verification = {**plain.verification, "logit_change_recovered": poor}
    (warning,) = plain.warnings
    assert f"only {poor:.1%}" in warning and "--embeddings save" in warning
    assert "model.embed_tokens.weight" in warning
    assert f"warning: {warning}" in str(plain) and plain.to_dict()["warnings"] == [warning]
    plain.verification = {**plain.verification, "logit_change_recovered": POOR_RECOVERY}
    assert plain.warnings == []
    saved.verification = {**saved.verification, "logit_change_recovered": poor}
    assert saved.warnings == []  # nothing left out: no embedding to name


def test_save_1d_false_leaves_norms_out(runs, tmp_path):
    base, tuned, _ = runs["llama"]
    rep = extract(base, tuned, tmp_path / "o", save_1d=False, embeddings="save", **FULL_RANK)
    norms = rep.categories["1-D"]
    assert norms.changed > 0 and norms.captured == 0.0 and norms.missed == norms.changed
    reasons = {s.reason for s in rep.missed_changes}
    assert reasons == {"1-D (save_1d=False)"}
    assert not any(m.endswith("norm") for m in rep.modules_to_save)


def test_verify_needs_models_it_can_run(runs, tmp_path):
    base, tuned, root = runs["llama"]
    with pytest.raises(UsageError, match="verify needs base"):
        extract(base.state_dict(), tuned, tmp_path / "a", verify=True)
    save_file({k: v.contiguous() for k, v in tuned.state_dict().items()}, tmp_path / "t.st")
    loose = tmp_path / "tuned.safetensors"
    (tmp_path / "t.st").rename(loose)
    with pytest.raises(UsageError, match="verify needs tuned"):
        extract(root / "base", loose, tmp_path / "b", verify=True)
    for bad in (0, -1, 2.5, "yes"):
        with pytest.raises(UsageError, match="verify must be"):
            extract(base, tuned, tmp_path / "c", verify=bad)
    assert not any((tmp_path / d).exists() for d in "abc")
