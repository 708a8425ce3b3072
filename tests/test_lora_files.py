"""LoRA files of other tools than PEFT (issue 54, items 1 and 2): kohya and
LyCORIS files (written by the real ``lycoris-lora`` after a few steps of
training, and files shaped by sd-scripts' own key naming, written with
``safetensors``), diffusers' ``save_lora_weights`` (the real ``diffusers``),
and mlx-lm adapters with their training output (the real ``mlx-lm`` on
CPU). Each is found as a store and judged like a PEFT adapter; every
number checked here is computed from the file's own tensors with torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path

import pytest

import adapterprobe as ap

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def records(root: Path, probes: list[str]) -> list[ap.Record]:
    return list(ap.scan(root, probes=probes))


def only(root: Path, probe: str) -> ap.Record:
    (record,) = records(root, [probe])
    return record


# ---- LyCORIS, trained ----


class Tiny(torch.nn.Module):
    """A linear layer and a conv layer, the two kinds a LoRA adapts."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.proj = torch.nn.Linear(6 * 4 * 4, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.head(torch.relu(self.proj(torch.relu(self.conv(x)).flatten(1))))


def lycoris_train(
    path: Path, algo: str, steps: int, seed: int = 0, lr: float = 1e-2
) -> list[float]:
    """Train a LyCORIS network of `algo` on a fixed regression, save it with
    sd-scripts' ss_* facts, and return the losses of every step."""
    lycoris = pytest.importorskip("lycoris")
    torch.manual_seed(seed)
    model = Tiny()
    for p in model.parameters():
        p.requires_grad_(False)
    lycoris.LycorisNetwork.apply_preset({"target_module": ["Linear", "Conv2d"], "target_name": []})
    net = lycoris.create_lycoris(model, 1.0, linear_dim=4, linear_alpha=2, algo=algo)
    net.apply_to()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(64, 3, 6, 6, generator=gen)
    y = torch.randn(64, 1, generator=gen)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "ss_network_module": f"lycoris.kohya ({algo})",
        "ss_network_dim": "4",
        "ss_network_alpha": "2",
        "ss_steps": str(steps),
        "ss_max_train_steps": str(steps),
        "ss_epoch": "1",
        "ss_num_epochs": "1",
        "ss_unet_lr": str(lr),
        "ss_sd_model_name": "tiny-test-model",
    }
    with contextlib.redirect_stdout(io.StringIO()):
        net.save_weights(str(path), torch.float32, metadata)
    return losses


def kohya_delta_fro(path: Path) -> dict[str, float]:
    """‖(alpha / r)·up·down‖_F of each module of a kohya-named file, by torch."""
    tensors = safetensors_torch.load_file(str(path))
    out = {}
    for key, down in tensors.items():
        if not key.endswith(".lora_down.weight"):
            continue
        module = key[: -len(".lora_down.weight")]
        up = tensors[f"{module}.lora_up.weight"].double()
        down = down.double()
        rank = down.shape[0]
        alpha = float(tensors[f"{module}.alpha"]) if f"{module}.alpha" in tensors else rank
        delta = (alpha / rank) * (up.flatten(1) @ down.flatten(1))
        out[module] = float(torch.linalg.matrix_norm(delta))
    return out


def test_a_lycoris_lora_is_a_store_judged_like_a_peft_adapter(tmp_path):
    file = tmp_path / "runs" / "my_lora.safetensors"
    lycoris_train(file, "lora", steps=30)
    weights = only(tmp_path, "adapter_weights")
    assert weights.layout == "lora-file", weights.store
    assert Path(weights.store) == file
    assert weights.verdict.value == "pass", weights.message
    assert weights.evidence["config"]["format"] == "kohya"
    report = ap.read_adapter_weights(file)
    want = kohya_delta_fro(file)
    got = {m.name: m.delta_fro for m in report.modules}
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-9), name
    conv = next(m for m in report.modules if m.name.endswith("conv"))
    assert (conv.in_features, conv.out_features) == (3 * 3 * 3, 6), "conv factors read flattened"
    assert conv.scale == pytest.approx(2 / 4)


def test_a_kohya_file_with_its_tensorboard_log_beside_it(tmp_path):
    """sd-scripts logs loss/current, loss/average and lr/unet to logs/."""
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    folder = tmp_path / "output"
    losses = lycoris_train(folder / "run.safetensors", "lora", steps=40)
    writer = tensorboard.SummaryWriter(str(folder / "logs" / "run20260101120000" / "network_train"))
    average = 0.0
    for step, loss in enumerate(losses, start=1):
        average += (loss - average) / step
        writer.add_scalar("loss/current", loss, step)
        writer.add_scalar("loss/average", average, step)
        writer.add_scalar("lr/unet", 1e-2, step)
    writer.close()
    drift = only(tmp_path, "training_drift")
    assert drift.layout == "lora-file"
    assert drift.evidence["series"] == "loss/current", drift.evidence
    facts = drift.evidence["run_facts"]
    assert "learning_rate" in facts["series"]
    assert facts["settings"]["steps"] == "40"
    assert facts["settings"]["network_module"] == "lycoris.kohya (lora)"
    assert facts["completion"] == "finished", facts
    assert "ss_* header" in facts["completion_text"]
    assert drift.verdict.value in {"pass", "warn"}, drift.message


def lycoris_applied_deltas(path: Path, **options: object) -> dict[str, torch.Tensor]:
    """The update each module of a LyCORIS file applies, by the library: the
    file loaded with ``create_lycoris_from_weights`` into a fresh model and
    the update read off the forward pass (``module(I) - base(I)``; a conv's
    from its rebuilt weight, flattened). ``get_diff_weight()`` is not used:
    in lycoris-lora 4.1 it multiplies by the scale a second time, which the
    forward pass (and the loaders of kohya and ComfyUI) do not."""
    lycoris = pytest.importorskip("lycoris")
    model = Tiny()
    with contextlib.redirect_stdout(io.StringIO()):
        net, _ = lycoris.create_lycoris_from_weights(1.0, str(path), model, **options)
    net.apply_to()
    out = {}
    with torch.no_grad():
        for lora in net.loras:
            base = lora.org_module[0]
            if isinstance(base, torch.nn.Linear):
                eye = torch.eye(base.in_features)
                delta = (lora(eye) - lora.org_forward(eye)).T
            else:
                delta = (lora.get_weight(lora.shape) * lora.scalar).flatten(1)
            out[lora.lora_name] = delta.double()
    return out


@pytest.mark.parametrize("algo", ["loha", "lokr"])
def test_loha_and_lokr_updates_are_judged_as_the_library_applies_them(tmp_path, algo):
    file = tmp_path / algo / f"{algo}.safetensors"
    lycoris_train(file, algo, steps=10)
    want = lycoris_applied_deltas(file)
    report = ap.read_adapter_weights(file)
    got = {m.name: m for m in report.modules}
    assert set(got) == set(want), (set(got), set(want))
    for name, delta in want.items():
        m = got[name]
        assert m.kind == algo
        norm = float(torch.linalg.matrix_norm(delta))
        assert norm > 0, name
        assert m.delta_fro == pytest.approx(norm, rel=1e-5), name
        sv = torch.linalg.svdvals(delta)
        assert m.singular_values[0] == pytest.approx(float(sv[0]), rel=1e-5), name
        assert m.rank_used == int((sv > 1e-5 * sv[0]).sum()), name
        assert (m.out_features, m.in_features) == tuple(delta.shape), name
    weights = only(tmp_path, "adapter_weights")
    assert weights.verdict.value == "pass", weights.message
    assert weights.evidence["peft_type"] == algo.upper()
    assert weights.evidence["config"]["format"] == f"lycoris-{algo}"
    assert f"LyCORIS {'LoHa' if algo == 'loha' else 'LoKr'} modules" in weights.message


def test_an_untrained_loha_changes_nothing_and_fails(tmp_path):
    lycoris_train(tmp_path / "loha.safetensors", "loha", steps=0)
    weights = only(tmp_path, "adapter_weights")
    assert weights.verdict.value == "fail", weights.message
    assert "dead_adapter" in weights.message and "hada_w2_a" in weights.message


def test_loha_and_lokr_files_are_compared_and_found_similar(tmp_path):
    for name, algo, seed in [("a", "loha", 1), ("b", "loha", 1), ("c", "lokr", 1)]:
        lycoris_train(tmp_path / name / f"{name}.safetensors", algo, steps=10, seed=seed)
    a, b, c = (tmp_path / n / f"{n}.safetensors" for n in "abc")
    (same,) = ap.compare(a, b).to_dict()["pairs"]
    assert same["similarity"] == pytest.approx(1.0, abs=1e-9), same
    (other,) = ap.compare(a, c).to_dict()["pairs"]
    assert other["similarity"] is not None and other["similarity"] < 0.99, other
    found = ap.similar(tmp_path)
    assert found["pairs_found"] == 1, found


def test_a_tucker_conv_loha_module_is_named_and_not_compared(tmp_path):
    """LoHa's Tucker conv factors (hada_t1/hada_t2) are not formed: the
    record names the module and why, the linear modules are judged."""
    lycoris = pytest.importorskip("lycoris")
    torch.manual_seed(0)
    model = Tiny()
    lycoris.LycorisNetwork.apply_preset({"target_module": ["Linear", "Conv2d"], "target_name": []})
    net = lycoris.create_lycoris(
        model, 1.0, linear_dim=4, linear_alpha=2, conv_dim=4, conv_alpha=2, algo="loha",
        use_tucker=True,
    )  # fmt: skip
    net.apply_to()
    with torch.no_grad():
        for lora in net.loras:
            lora.hada_w2_a.normal_()
    file = tmp_path / "tucker.safetensors"
    with contextlib.redirect_stdout(io.StringIO()):
        net.save_weights(str(file), torch.float32, {})
    report = ap.read_adapter_weights(file)
    assert sorted(m.name for m in report.modules) == ["lycoris_head", "lycoris_proj"]
    (unformed,) = report.unformed_modules
    assert unformed.startswith("lycoris_conv: LoHa with Tucker conv factors"), unformed
    weights = only(tmp_path, "adapter_weights")
    assert weights.evidence["unformed_modules"] == [unformed]
    assert "not formed" in weights.message
    (pair,) = ap.compare(file, file).to_dict()["pairs"]
    assert pair["similarity"] is None and "not formed" in pair["error"], pair


def test_two_kohya_files_are_compared_and_found_similar(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    lycoris_train(a, "lora", steps=20, seed=1)
    lycoris_train(b, "lora", steps=20, seed=1)
    (pair,) = ap.compare(a, b).to_dict()["pairs"]
    assert pair["similarity"] == pytest.approx(1.0, abs=1e-9), pair
    found = ap.similar(tmp_path)
    assert found["pairs_found"] == 1, found


# ---- files shaped by sd-scripts' own naming ----


def sd_scripts_file(path: Path, steps: int, zero_up: bool = False) -> None:
    """A file laid out as sd-scripts' networks/lora.py saves one: lora_unet_/
    lora_te_ module names (the module path with dots as underscores),
    fp16 factors and alpha, a conv LoRA's 4-D factors, ss_* strings."""
    gen = torch.Generator().manual_seed(7)
    tensors = {}
    modules = {
        "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q": ((8, 32), (32, 8)),
        "lora_unet_down_blocks_0_resnets_0_conv1": ((8, 16, 3, 3), (32, 8, 1, 1)),
        "lora_te_text_model_encoder_layers_0_self_attn_q_proj": ((8, 24), (24, 8)),
    }
    for name, (down, up) in modules.items():
        tensors[f"{name}.lora_down.weight"] = torch.randn(down, generator=gen).half()
        u = torch.zeros(up) if zero_up else torch.randn(up, generator=gen) * 0.1
        tensors[f"{name}.lora_up.weight"] = u.half()
        tensors[f"{name}.alpha"] = torch.tensor(4.0).half()
    metadata = {
        "ss_network_module": "networks.lora",
        "ss_network_dim": "8",
        "ss_network_alpha": "4.0",
        "ss_steps": str(steps),
        "ss_max_train_steps": str(steps),
        "ss_epoch": "1",
        "ss_num_epochs": "1",
        "ss_learning_rate": "0.0001",
        "ss_sd_model_name": "v1-5-pruned-emaonly.safetensors",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(tensors, str(path), metadata=metadata)


def test_a_header_that_says_5_steps_is_a_run_of_5_steps(tmp_path):
    file = tmp_path / "smoke" / "smoke_test.safetensors"
    sd_scripts_file(file, steps=5)
    drift = only(file, "training_drift")
    assert drift.layout == "lora-file"
    assert drift.verdict.value == "fail", drift.message
    rules = {f["rule"] for f in drift.evidence["findings"]}
    assert rules == {"tiny_run"}, drift.evidence
    assert "ss_* header" in drift.message
    weights = only(file, "adapter_weights")
    assert weights.verdict.value == "pass", weights.message
    report = ap.read_adapter_weights(file)
    want = kohya_delta_fro(file)
    assert {m.name: m.delta_fro for m in report.modules} == pytest.approx(want, rel=1e-9)
    assert report.config is not None and report.config.base_model_name_or_path.startswith("v1-5")


def test_a_long_run_without_a_log_is_a_skip_saying_what_its_header_holds(tmp_path):
    sd_scripts_file(tmp_path / "style.safetensors", steps=1600)
    drift = only(tmp_path, "training_drift")
    assert drift.verdict.value == "skip", drift.message
    assert "1600 steps" in drift.message
    assert drift.evidence["run_facts"]["settings"]["max_train_steps"] == "1600"


def test_a_kohya_file_whose_up_factors_never_moved_fails(tmp_path):
    sd_scripts_file(tmp_path / "dead.safetensors", steps=800, zero_up=True)
    weights = only(tmp_path, "adapter_weights")
    assert weights.verdict.value == "fail", weights.message


def test_lora_files_beside_other_files_are_each_a_store(tmp_path):
    sd_scripts_file(tmp_path / "loras" / "a.safetensors", steps=100)
    sd_scripts_file(tmp_path / "loras" / "a-000001.safetensors", steps=50)
    (tmp_path / "loras" / "notes.txt").write_text("downloaded\n")
    other = tmp_path / "loras" / "other.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(2)}, str(other))
    stores = sorted(Path(r.store).name for r in records(tmp_path, ["adapter_weights"]))
    assert stores == ["a-000001.safetensors", "a.safetensors"]


# ---- diffusers ----


def test_a_diffusers_lora_is_scaled_by_the_config_in_its_header(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    peft = pytest.importorskip("peft")
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8,
        norm_num_groups=4,
        attention_head_dim=2,
    )
    targets = ["to_q", "to_k", "to_v", "to_out.0", "conv1"]
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=targets, init_lora_weights="gaussian"
    )
    unet.add_adapter(config)
    # A few steps of denoising a fixed batch: lora_B leaves its zero init.
    params = [p for n, p in unet.named_parameters() if "lora_" in n]
    opt = torch.optim.Adam(params, lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    sample, noise = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 4, 8, 8, generator=gen)
    context = torch.randn(2, 3, 8, generator=gen)
    for _ in range(3):
        predicted = unet(sample, 10, encoder_hidden_states=context).sample
        loss = torch.nn.functional.mse_loss(predicted, noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = get_peft_model_state_dict(unet)
    folder = tmp_path / "sd-lora"
    diffusers.StableDiffusionPipeline.save_lora_weights(
        str(folder), unet_lora_layers=state, unet_lora_adapter_metadata=config.to_dict()
    )
    file = folder / "pytorch_lora_weights.safetensors"
    weights = only(tmp_path, "adapter_weights")
    assert weights.layout == "lora-file" and Path(weights.store) == file
    assert weights.verdict.value == "pass", weights.message
    report = ap.read_adapter_weights(file)
    tensors = safetensors_torch.load_file(str(file))
    conv = [m for m in report.modules if m.name.endswith("conv1")]
    assert conv, "conv LoRA modules are read"
    for m in report.modules:
        assert m.scale == pytest.approx(2.0)
        a = tensors[f"{m.name}.lora_A.weight"].double().flatten(1)
        b = tensors[f"{m.name}.lora_B.weight"].double().flatten(1)
        assert m.delta_fro == pytest.approx(float(torch.linalg.matrix_norm(2.0 * b @ a)), rel=1e-9)


# ---- mlx-lm ----


def mlx_train(folder: Path, iters: int, lr: float) -> None:
    """A fresh mlx-lm run (tools/realruns/mlx_runs.py), where mlx installs."""
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm.models.llama")
    from realruns.mlx_runs import mlx_train as train

    train(folder, iters, lr)


MLX_FIXTURES = Path(__file__).parent / "fixtures" / "mlx-lm"


def judge_mlx_run(root: Path, folder: Path) -> None:
    """What every mlx-lm run of 24 iterations at lr 1e-2 must give."""
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["lora_parameters"]["scale"] == 20.0
    weights = only(root, "adapter_weights")
    assert weights.layout == "mlx", weights.store
    assert weights.verdict.value == "pass", weights.message
    report = ap.read_adapter_weights(folder)
    tensors = safetensors_torch.load_file(str(folder / "adapters.safetensors"))
    assert report.modules
    for m in report.modules:
        a = tensors[f"{m.name}.lora_a"].double()  # in × r
        b = tensors[f"{m.name}.lora_b"].double()  # r × out
        delta = 20.0 * (a @ b).T
        assert m.delta_fro == pytest.approx(float(torch.linalg.matrix_norm(delta)), rel=1e-9)
        assert (m.in_features, m.out_features) == (a.shape[0], b.shape[1])
    drift = only(root, "training_drift")
    assert drift.layout == "mlx"
    assert drift.evidence["log_source"] == "mlx_log", drift.evidence
    facts = drift.evidence["run_facts"]
    assert facts["completion"] == "finished", facts
    assert facts["steps_done"] == 24 and facts["steps_planned"] == 24
    assert facts["settings"]["scale"] == "20"
    assert "eval_loss" in facts["series"]
    lines = (folder / "train.log").read_text().splitlines()
    logged = [line for line in lines if "▼" in line or "▲" in line]
    assert drift.evidence["num_steps"] == len(logged), drift.evidence


@pytest.mark.parametrize("name", ["healthy", "hot"])
def test_mlx_runs_the_real_mlx_lm_wrote_are_judged_without_mlx(tmp_path, name):
    """The committed runs of tools/realruns/mlx_runs.py (mlx has no wheel
    for the lock's platform, so CI judges the files it wrote here)."""
    import shutil

    folder = tmp_path / name
    shutil.copytree(MLX_FIXTURES / name, folder)
    if name == "healthy":
        judge_mlx_run(tmp_path, folder)
        return
    drift = only(tmp_path, "training_drift")
    assert drift.layout == "mlx"
    assert drift.verdict.value in {"warn", "fail"}, drift.message


def test_an_mlx_adapter_and_its_training_output_are_judged(tmp_path):
    folder = tmp_path / "mlx-run"
    mlx_train(folder, iters=24, lr=1e-2)
    judge_mlx_run(tmp_path, folder)


def test_an_mlx_run_that_learned_nothing_is_flagged(tmp_path):
    """At lr 30 the loss falls once and sticks at a uniform guess (ln 64)."""
    mlx_train(tmp_path / "hot", iters=24, lr=30.0)
    drift = only(tmp_path, "training_drift")
    assert drift.layout == "mlx"
    assert drift.verdict.value in {"warn", "fail"}, drift.message


def test_an_mlx_adapter_without_its_output_says_where_it_would_be(tmp_path):
    folder = tmp_path / "mlx-run"
    mlx_train(folder, iters=4, lr=1e-2)
    os.remove(folder / "train.log")
    drift = only(tmp_path, "training_drift")
    assert drift.verdict.value == "skip"
    assert "tee train.log" in drift.message
    assert not math.isnan(ap.read_adapter_weights(folder).modules[0].delta_fro or math.nan)
