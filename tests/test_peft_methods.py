"""Adapters of PEFT methods other than LoRA (IA3, prompt tuning), saved by the
real ``peft`` from a tiny GPT-2 built from a config: judged for what breaks
any adapter (non-finite values, tensors of zeros), never an ``error``; and
a LoRA comparison says it cannot compare them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import adapterprobe as ap

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def tiny_model():
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def save(out: Path, config, edit=None) -> Path:
    model = peft.get_peft_model(tiny_model(), config)
    if edit is not None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.requires_grad:
                    edit(name, param)
    model.save_pretrained(str(out))
    return out


def ia3():
    return peft.IA3Config(target_modules=["c_attn", "c_fc"], feedforward_modules=["c_fc"])


def weights_record(adapter: Path) -> ap.ProbeResult:
    (record,) = [r for r in ap.scan(adapter) if r.probe == "adapter_weights"]
    return record


def test_ia3_and_prompt_tuning_adapters_are_judged(tmp_path):
    prompt = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    for name, config in (("ia3", ia3()), ("prompt", prompt)):
        record = weights_record(save(tmp_path / name, config))
        assert record.verdict.value == "pass", record.message
        assert record.evidence["peft_type"] == {"ia3": "IA3", "prompt": "PROMPT_TUNING"}[name]


def test_nan_and_zero_ia3_vectors_fail(tmp_path):
    def nan_first(name, param):
        if "h.0.attn" in name:
            param[0] = float("nan")

    record = weights_record(save(tmp_path / "nan", ia3(), nan_first))
    assert record.verdict.value == "fail" and "nonfinite_weights" in record.message

    record = weights_record(save(tmp_path / "zero", ia3(), lambda _, p: p.zero_()))
    assert record.verdict.value == "fail" and record.message.startswith("zero_weights")

    def zero_one(name, param):
        if "h.1.mlp" in name:
            param.zero_()

    record = weights_record(save(tmp_path / "one", ia3(), zero_one))
    assert record.verdict.value == "warn", record.message
    assert "h.1.mlp.c_fc" in record.message


def test_lora_comparison_says_it_cannot_compare_another_method(tmp_path):
    a = save(tmp_path / "a", ia3())
    result = ap.compare(a, a).to_dict()
    assert result["similarity"] is None
    assert 'peft_type is "IA3"' in result["pair_error"]


def test_a_frozen_original_module_saved_beside_its_trained_copy_is_not_judged(tmp_path):
    """IA3 on a sequence classifier: PEFT wraps the head in modules_to_save, and
    the whole PeftModel.state_dict() keeps the frozen original (whose bias the
    base model initialised to zeros) beside the trained copy. Saved with it,
    the adapter is judged as PEFT's own save is: the original is the base
    model's, not a dead adapter tensor."""
    bert = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    config = peft.IA3Config(
        task_type="SEQ_CLS",
        target_modules=["query", "value", "output.dense"],
        feedforward_modules=["output.dense"],
    )
    model = peft.get_peft_model(transformers.BertForSequenceClassification(bert), config)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, 64, (4, 8), generator=gen)
        labels = torch.randint(0, 3, (4,), generator=gen)
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    own = tmp_path / "save_pretrained"
    model.save_pretrained(own)

    # The adapter's own tensors under PEFT's saved names, plus the head's
    # frozen original and trained copy as PeftModel.state_dict() names them.
    kept = tmp_path / "state_dict"
    kept.mkdir()
    (kept / "adapter_config.json").write_bytes((own / "adapter_config.json").read_bytes())
    state = {}
    for key, value in model.state_dict().items():
        if ".ia3_l." in key or "modules_to_save" in key or "original_module" in key:
            state[key.replace(".ia3_l.default", ".ia3_l")] = value.detach().clone().contiguous()
    frozen = "base_model.model.classifier.original_module.bias"
    assert frozen in state and not state[frozen].any()
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file(state, str(kept / "adapter_model.safetensors"))

    for adapter in (own, kept):
        record = weights_record(adapter)
        assert record.verdict.value == "pass", (adapter.name, record.message)
        assert record.evidence["zero_tensors"] == []
    assert weights_record(kept).evidence["frozen_originals"] == [
        frozen,
        "base_model.model.classifier.original_module.weight",
    ]
