"""K, what a run's loss is a cross-entropy over, read from every place a
run carries it (issue 52, item 1), on runs written by the real libraries:
the TensorBoard ``model_config`` text of an HF Trainer run, a LoRA's base
model on disk, and a Lightning ``hparams.yaml``. With K known, a loss far
above ln K FAILs whatever the curve's shape; without it, the same run's
fall from thousands reads as progress.
"""

from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import adapterprobe as ap  # noqa: E402

VOCAB = 128


def drift(root: Path) -> ap.Record:
    """The one training_drift record of the one run under ``root``."""
    (record,) = list(ap.scan(root, probes=["training_drift"]))
    return record


def saved_base(root: Path) -> Path:
    """A tiny Llama saved as a pretrained model (its config.json names its
    architecture, as a downloaded model's does)."""
    pytest.importorskip("transformers")
    from realruns.tiny import tiny_llama

    base = root / "base"
    tiny_llama(0, vocab=VOCAB, max_positions=32).save_pretrained(base)
    return base


def hf_train(model, out: Path, lr: float, report_to: list[str], steps: int = 12):
    transformers = pytest.importorskip("transformers")
    from test_integrations import TokenData

    torch.manual_seed(0)
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=steps,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=lr,
            lr_scheduler_type="constant",
            save_strategy="no",
            report_to=report_to,
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(48, 8, VOCAB),
    )
    trainer.train()
    return trainer


def test_a_tensorboard_only_blow_up_fails_with_k_from_its_model_config(tmp_path):
    """A full fine-tune at lr=10 logged only to TensorBoard (no trainer
    state, no saved config.json): the Trainer's TensorBoard callback wrote
    the model's config as text, and K = 128 from it makes the loss, far
    above ln 128, a FAIL."""
    pytest.importorskip("tensorboard")
    transformers = pytest.importorskip("transformers")
    base = saved_base(tmp_path)
    out = tmp_path / "tb-only"
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    trainer = hf_train(model, out, lr=10.0, report_to=["tensorboard"])
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert max(logged) > 1.5 * math.log(VOCAB), logged  # the run did blow up
    assert not (out / "trainer_state.json").exists() and not (out / "config.json").exists()
    record = drift(out)
    assert record.evidence["log_source"] == "tensorboard", record.message
    assert record.evidence["output_classes"] == VOCAB
    assert record.evidence["output_classes_source"] == "the TensorBoard model_config text"
    assert record.verdict == "fail", record.message
    rules = {f["rule"] for f in record.evidence["findings"]}
    assert "worse_than_uniform" in rules, record.message
    # The facts say where K came from.
    assert "TensorBoard model_config" in record.evidence["run_facts"]["objective_text"]


def test_a_loras_base_model_on_disk_says_k(tmp_path):
    """A LoRA saved by PEFT names its base by path; the base's config.json
    there says the vocabulary, so ln 128 is the only chance level tried."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    base = saved_base(tmp_path)
    out = tmp_path / "lora"
    model = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(base),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainer = hf_train(model, out, lr=1e-3, report_to=[])
    trainer.save_model()
    trainer.save_state()
    assert not (out / "config.json").exists()
    record = drift(out)
    assert record.evidence["output_classes"] == VOCAB, record.message
    assert record.evidence["output_classes_source"].startswith("the base model's config.json")
    # Moved elsewhere, the base says nothing, and nothing is guessed.
    shutil.move(base, tmp_path / "moved")
    assert "output_classes" not in drift(out).evidence


def test_a_lightning_run_reads_k_from_its_hparams_yaml(tmp_path):
    """A next-token model in the real Lightning, Adam at lr=10, logged by
    CSVLogger beside the hparams.yaml that save_hyperparameters writes:
    vocab_size there is K, and the loss far above ln K FAILs."""
    L = pytest.importorskip("lightning")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class TinyLM(L.LightningModule):
        def __init__(self, vocab_size: int = VOCAB):
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.embed = nn.Embedding(vocab_size, 32)
            self.head = nn.Linear(32, vocab_size)

        def training_step(self, batch, batch_idx):
            (tokens,) = batch
            logits = self.head(self.embed(tokens[:, :-1]))
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
            )
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=10.0)

    tokens = torch.randint(0, VOCAB, (480, 16), generator=torch.Generator().manual_seed(1))
    trainer = L.Trainer(
        max_steps=60,
        accelerator="cpu",
        devices=1,
        logger=L.pytorch.loggers.CSVLogger(str(tmp_path), name="lm"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyLM(), DataLoader(TensorDataset(tokens), batch_size=8))
    version = tmp_path / "lm" / "version_0"
    assert (version / "hparams.yaml").is_file() and (version / "metrics.csv").is_file()
    record = drift(version)
    assert record.evidence["output_classes"] == VOCAB, record.message
    assert record.evidence["output_classes_source"] == "hparams.yaml"
    assert record.verdict == "fail", record.message
    assert "worse_than_uniform" in {f["rule"] for f in record.evidence["findings"]}
