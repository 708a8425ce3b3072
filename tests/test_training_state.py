"""read_training_state against torch.load on real optimizer states.

The states come from actually training a tiny PEFT LoRA model with AdamW and
saving it the way dlm does (realruns.dlm.save_training_state), then variants of
that state: other float dtypes, non-contiguous views, NaN/inf, sidecars.
Every field is compared with what torch.load gives for the same file.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from adapterprobe import (  # noqa: E402
    IntegrityError,
    MissingFileError,
    TrainingStateError,
    UnsafePickleError,
    read_training_state,
)
from realruns.dlm import save_training_state, train_tiny_lora  # noqa: E402

VERSIONS = {"torch": str(torch.__version__), "bitsandbytes": None}


class FrozenOptimizer:
    """Stands in for an optimizer whose state_dict we chose (dtype/view variants)."""

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self._state_dict = state_dict

    def state_dict(self) -> dict[str, Any]:
        return self._state_dict


def torch_reference(path: Path, *, weights_only: bool = True) -> dict[str, Any]:
    """What the seed computes with torch: the fields and per-param float64 means."""
    state = torch.load(path, weights_only=weights_only)
    per_param = []
    for pid in sorted(state["optimizer_state_dict"]["state"]):
        t = state["optimizer_state_dict"]["state"][pid]["exp_avg_sq"]
        per_param.append(
            {
                "param_id": pid,
                "numel": t.numel(),
                "exp_avg_sq_mean": t.to(torch.float64).mean().item(),
                "nonfinite": int((~torch.isfinite(t)).sum().item()),
            }
        )
    best = state["best_val_loss"]
    return {
        "global_step": state["global_step"],
        "epoch": state["epoch"],
        "best_val_loss": math.nan if best is None else best,
        "use_qlora": state["use_qlora"],
        "per_param": per_param,
    }


def same_float(a: float, b: float, rel: float = 1e-12) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def assert_matches_torch(path: Path, *, weights_only: bool = True) -> Any:
    ours = read_training_state(path)
    file = path if path.is_file() else path / "training_state.pt"
    ref = torch_reference(file, weights_only=weights_only)
    assert ours.global_step == ref["global_step"]
    assert type(ours.global_step) is int
    assert (ours.epoch is None and ref["epoch"] is None) or ours.epoch == ref["epoch"]
    assert same_float(ours.best_val_loss, ref["best_val_loss"], rel=0.0)
    assert ours.use_qlora is ref["use_qlora"]
    assert len(ours.per_param) == len(ref["per_param"])
    for got, want in zip(ours.per_param, ref["per_param"], strict=True):
        assert got.param_id == want["param_id"]
        assert got.numel == want["numel"]
        assert got.nonfinite == want["nonfinite"], got
        assert same_float(got.exp_avg_sq_mean, want["exp_avg_sq_mean"]), (got, want)
    return ours


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One tiny LoRA run (AdamW, LambdaLR, GradScaler), trained for a few steps."""
    return train_tiny_lora(steps=4, amp_scaler=True)


@pytest.fixture(scope="module")
def version_dir(trained: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("v0001")
    save_training_state(
        out / "training_state.pt",
        trained.optimizer,
        global_step=trained.global_step,
        epoch=trained.epoch,
        best_val_loss=0.75,
        use_qlora=True,
        scheduler=trained.scheduler,
        scaler=trained.scaler,
        versions=VERSIONS,
    )
    return out


def variant(trained: Any, out: Path, change: Any, **fields: Any) -> Path:
    """Save the trained state after `change(pid, state) -> state` on each param."""
    sd = trained.optimizer.state_dict()
    sd = {
        "state": {pid: change(pid, dict(s)) for pid, s in sd["state"].items()},
        "param_groups": sd["param_groups"],
    }
    args = {"global_step": 7, "epoch": 1.5, "best_val_loss": None, "use_qlora": False}
    args.update(fields)
    path = out / "training_state.pt"
    save_training_state(path, FrozenOptimizer(sd), versions=VERSIONS, **args)
    return path


def test_real_state_matches_torch_load(version_dir: Path, trained: Any) -> None:
    ours = assert_matches_torch(version_dir)
    assert ours.path == version_dir / "training_state.pt"
    assert ours.global_step == trained.global_step == 4
    assert ours.best_val_loss == 0.75
    assert ours.use_qlora is True
    # 2 layers x (q_proj, v_proj) x (lora_A, lora_B)
    assert [p.param_id for p in ours.per_param] == list(range(8))
    assert all(p.exp_avg_sq_mean > 0 and p.nonfinite == 0 for p in ours.per_param)
    assert "ParamStat(param_id=0" in repr(ours.per_param[0])
    assert "global_step=4" in repr(ours)


def test_file_path_and_directory_agree(version_dir: Path) -> None:
    a = read_training_state(version_dir)
    b = read_training_state(str(version_dir / "training_state.pt"))
    assert [p.exp_avg_sq_mean for p in a.per_param] == [p.exp_avg_sq_mean for p in b.per_param]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_other_float_dtypes(trained: Any, tmp_path: Path, dtype: str) -> None:
    dt = getattr(torch, dtype)
    path = variant(
        trained, tmp_path, lambda pid, s: {**s, "exp_avg_sq": (s["exp_avg_sq"] * 1e3).to(dt)}
    )
    ours = assert_matches_torch(path)
    assert all(p.exp_avg_sq_mean > 0 for p in ours.per_param)


def test_mixed_dtypes_and_missing_optional_fields(trained: Any, tmp_path: Path) -> None:
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
    path = variant(
        trained,
        tmp_path,
        lambda pid, s: {**s, "exp_avg_sq": s["exp_avg_sq"].to(dtypes[pid % 4])},
        epoch=0.25,
        best_val_loss=None,
    )
    ours = assert_matches_torch(path)
    assert math.isnan(ours.best_val_loss)
    assert ours.epoch == 0.25
    assert ours.global_step == 7
    assert ours.use_qlora is False


def test_non_contiguous_views(trained: Any, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)

    def view(pid: int, s: dict[str, Any]) -> dict[str, Any]:
        shape = s["exp_avg_sq"].shape
        base = torch.rand(shape[1] + 3, shape[0] * 2 + 1, generator=gen)
        kinds = [
            base.t()[: shape[0], 1 : shape[1] + 1],  # transposed, offset
            base[1:, ::2],  # row step 2
            base.t()[1::2],  # transposed, stepped rows
            base[2:5],  # plain slice with an offset
        ]
        return {**s, "exp_avg_sq": kinds[pid % len(kinds)]}

    path = variant(trained, tmp_path, view)
    saved = torch.load(path, weights_only=True)["optimizer_state_dict"]["state"]
    assert not all(t["exp_avg_sq"].is_contiguous() for t in saved.values())
    assert_matches_torch(path)


def test_views_sharing_one_storage(trained: Any, tmp_path: Path) -> None:
    base = torch.linspace(0.0, 1.0, 4096)

    def share(pid: int, s: dict[str, Any]) -> dict[str, Any]:
        n = s["exp_avg_sq"].numel()
        return {**s, "exp_avg_sq": base[pid * 100 : pid * 100 + n]}

    assert_matches_torch(variant(trained, tmp_path, share))


def test_nan_and_inf_are_counted(trained: Any, tmp_path: Path) -> None:
    def poison(pid: int, s: dict[str, Any]) -> dict[str, Any]:
        t = s["exp_avg_sq"].clone().flatten()
        if pid == 1:
            t[3] = math.nan
        if pid == 2:
            t[:5] = math.inf
        if pid == 3:
            t[0], t[1] = math.nan, math.inf
        if pid == 4:
            t[:] = math.nan
        return {**s, "exp_avg_sq": t.reshape(s["exp_avg_sq"].shape)}

    ours = assert_matches_torch(variant(trained, tmp_path, poison))
    stats = {p.param_id: p for p in ours.per_param}
    assert stats[0].nonfinite == 0 and math.isfinite(stats[0].exp_avg_sq_mean)
    assert stats[1].nonfinite == 1 and math.isnan(stats[1].exp_avg_sq_mean)
    assert stats[2].nonfinite == 5 and stats[2].exp_avg_sq_mean == math.inf
    assert stats[3].nonfinite == 2 and math.isnan(stats[3].exp_avg_sq_mean)
    assert stats[4].nonfinite == stats[4].numel


def test_empty_optimizer_state(tmp_path: Path) -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p])
    path = tmp_path / "training_state.pt"
    save_training_state(
        path, opt, global_step=0, epoch=0.0, best_val_loss=None, use_qlora=False, versions={}
    )
    ours = read_training_state(path)
    assert ours.per_param == []
    assert ours.global_step == 0


def test_payload_without_optional_fields(tmp_path: Path) -> None:
    path = tmp_path / "bare.pt"
    torch.save({"global_step": 3, "optimizer_state_dict": {"state": {}, "param_groups": []}}, path)
    ours = read_training_state(path)
    assert (ours.global_step, ours.epoch, ours.use_qlora) == (3, None, False)
    assert math.isnan(ours.best_val_loss)
    torch.save({"optimizer_state_dict": {"state": {}}}, path)
    with pytest.raises(TrainingStateError, match="global_step"):
        read_training_state(path)
    torch.save({"global_step": 3, "scheduler_state_dict": {}}, path)
    with pytest.raises(TrainingStateError, match="optimizer_state_dict"):
        read_training_state(path)


def test_other_pickle_protocols(trained: Any, tmp_path: Path) -> None:
    """torch.save(pickle_protocol=4) uses FRAME, MEMOIZE and short strings."""
    payload = torch.load(
        variant(trained, tmp_path, lambda pid, s: s), weights_only=True, map_location="cpu"
    )
    for protocol in (2, 3, 4, 5):
        out = tmp_path / f"p{protocol}.pt"
        torch.save(payload, out, pickle_protocol=protocol)
        # torch's weights_only loader stops at protocol 4's FRAME opcode; this
        # file was written by this test, so the full unpickler is safe here.
        assert_matches_torch(out, weights_only=False)


def test_sidecar_is_checked(version_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "v"
    shutil.copytree(version_dir, work)
    state = work / "training_state.pt"
    side = work / "training_state.pt.sha256"
    # The sidecar written by the trainer matches.
    assert side.read_text().strip() == hashlib.sha256(state.read_bytes()).hexdigest()
    read_training_state(work)
    # sha256sum-style and uppercase sidecars are accepted.
    side.write_text(
        hashlib.sha256(state.read_bytes()).hexdigest().upper() + "  training_state.pt\n"
    )
    read_training_state(work)
    # A digest of other content is an integrity failure.
    side.write_text(hashlib.sha256(b"something else").hexdigest() + "\n")
    with pytest.raises(IntegrityError, match=r"training_state\.pt") as err:
        read_training_state(work)
    assert err.value.expected == hashlib.sha256(b"something else").hexdigest()
    assert err.value.actual == hashlib.sha256(state.read_bytes()).hexdigest()
    assert err.value.path == str(state)
    side.write_text("not a digest\n")
    with pytest.raises(IntegrityError):
        read_training_state(work)
    side.unlink()
    read_training_state(work)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match=r"training_state\.pt"):
        read_training_state(tmp_path)
    with pytest.raises(MissingFileError):
        read_training_state(tmp_path / "nope.pt")


def test_foreign_optimizer_states(tmp_path: Path) -> None:
    w = torch.nn.Parameter(torch.ones(4))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    w.sum().backward()
    sgd.step()
    path = tmp_path / "sgd.pt"
    save_training_state(
        path, sgd, global_step=1, epoch=1.0, best_val_loss=None, use_qlora=False, versions={}
    )
    with pytest.raises(TrainingStateError, match="foreign state") as err:
        read_training_state(path)
    assert "momentum_buffer" in str(err.value)
    assert not isinstance(err.value, UnsafePickleError)

    eight_bit = {
        "state": {
            0: {
                "step": torch.tensor(3.0),
                "state1": torch.zeros(4, dtype=torch.uint8),
                "state2": torch.zeros(4, dtype=torch.uint8),
                "qmap1": torch.zeros(256),
                "absmax1": torch.ones(1),
            }
        },
        "param_groups": [{"params": [0]}],
    }
    path = tmp_path / "bnb.pt"
    save_training_state(
        path,
        FrozenOptimizer(eight_bit),
        global_step=3,
        epoch=1.0,
        best_val_loss=None,
        use_qlora=True,
        versions={},
    )
    with pytest.raises(TrainingStateError, match="foreign state") as err:
        read_training_state(path)
    assert "state1" in str(err.value) and "absmax1" in str(err.value)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "float8_e4m3fn", "complex64"])
def test_other_dtypes_are_reported(tmp_path: Path, dtype: str) -> None:
    t = torch.ones(6).to(getattr(torch, dtype))
    sd = {"state": {0: {"step": torch.tensor(1.0), "exp_avg_sq": t}}, "param_groups": []}
    path = tmp_path / "odd.pt"
    save_training_state(
        path,
        FrozenOptimizer(sd),
        global_step=1,
        epoch=1.0,
        best_val_loss=None,
        use_qlora=False,
        versions={},
    )
    with pytest.raises(TrainingStateError, match=dtype) as err:
        read_training_state(path)
    assert not isinstance(err.value, UnsafePickleError)


# ---------------------------------------------------------------------------
# Property test: our reduction vs a numpy reference over random views.

FLOATS = {
    "float32": (np.uint32, np.float32),
    "float16": (np.uint16, np.float16),
    "bfloat16": (np.uint16, None),
    "float64": (None, np.float64),
}


def numpy_decode(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Decode raw storage bits to float64 with numpy only (bf16 by bit shifting)."""
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view(FLOATS[dtype][1]).astype(np.float64)


@st.composite
def float_views(draw: st.DrawFn) -> tuple[str, np.ndarray, tuple[int, ...], int, int]:
    dtype = draw(st.sampled_from(sorted(FLOATS)))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    n = int(np.prod(shape))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if dtype == "float64":
        # Non-negative (like exp_avg_sq) over a wide but summable range.
        values = rng.random(n) * 10.0 ** rng.uniform(-30, 30, n)
        bits = values.view(np.uint64)
    else:
        utype = FLOATS[dtype][0]
        width = np.iinfo(utype).bits
        bits = rng.integers(0, 2 ** (width - 1), n, dtype=np.uint64).astype(utype)
    specials = draw(st.integers(0, 2))
    if n and specials:
        nan_or_inf = {
            "float32": [0x7FC00000, 0x7F800000],
            "float16": [0x7E00, 0x7C00],
            "bfloat16": [0x7FC0, 0x7F80],
            "float64": [0x7FF8000000000000, 0x7FF0000000000000],
        }[dtype]
        bits[rng.integers(0, n, specials)] = nan_or_inf[specials - 1]
    perm = draw(st.permutations(range(len(shape))))
    step = draw(st.integers(1, 3))
    return dtype, bits.reshape(shape), tuple(perm), step, seed


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=float_views())
def test_reduction_matches_numpy(tmp_path: Path, case: Any) -> None:
    dtype, bits, perm, step, _ = case
    same_width_int = {2: np.int16, 4: np.int32, 8: np.int64}[bits.itemsize]
    base = torch.from_numpy(bits.view(same_width_int)).view(getattr(torch, dtype))
    view = base.permute(perm)[::step]
    ref = numpy_decode(bits, dtype).transpose(perm)[::step]

    sd = {"state": {5: {"exp_avg_sq": view}}, "param_groups": []}
    path = tmp_path / "prop.pt"
    save_training_state(
        path,
        FrozenOptimizer(sd),
        global_step=1,
        epoch=0.0,
        best_val_loss=None,
        use_qlora=False,
        versions={},
    )
    (got,) = read_training_state(path).per_param
    assert got.param_id == 5
    assert got.numel == ref.size
    assert got.nonfinite == int((~np.isfinite(ref)).sum())
    want = float(ref.mean()) if ref.size else math.nan
    assert same_float(got.exp_avg_sq_mean, want, rel=1e-9), (got, want)
