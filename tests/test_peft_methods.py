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
