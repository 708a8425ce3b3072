"""What is being compared: a path resolved to an adapter and a loss curve.

A path may be a bare adapter (a directory holding ``adapter_model.safetensors``
or ``adapter_model.bin``, or that file), an HF Trainer output directory or checkpoint (adapter plus
``trainer_state.json`` / TensorBoard events), or any store the scan knows
(dlm, Lightning, ...), whose newest adapter version and logs are used. Each
side carries what could not be read as a note instead of failing the whole
comparison; only a path with neither an adapter nor a curve is refused.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe.errors import AdapterProbeError, MissingFileError

ADAPTER_FILE = "adapter_model.safetensors"
#: The same state dict written by torch.save (save_pretrained(safe_serialization=False)).
PICKLED_ADAPTER_FILE = "adapter_model.bin"
CURVE_POINTS = 400  # points kept per curve for charts


@dataclass
class Side:
    """One thing being compared."""

    label: str
    path: Path
    kind: str  # "adapter", "run" or "store"
    adapter: Path | None = None
    curve: Any = None  # _core.LossCurve
    notes: list[str] = field(default_factory=list)
    #: The gathered training_drift input the curve belongs to (a
    #: ``DriftInput``), judged to choose the level the runs are timed to.
    drift: Any = None


def _holds_adapter(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".safetensors" or path.name == PICKLED_ADAPTER_FILE
    return (path / ADAPTER_FILE).is_file() or (path / PICKLED_ADAPTER_FILE).is_file()


def _try_curve(source: Path, side: Side) -> None:
    try:
        side.curve = _core.read_loss_curve(source)
    except AdapterProbeError as exc:
        side.notes.append(f"no loss curve: {exc}")
        return
    try:
        side.drift = _core.drift_input(source)
    except AdapterProbeError as exc:
        side.notes.append(f"loss curve not judged: {exc}")


def resolve(path: str | os.PathLike[str], label: str) -> Side:
    """The adapter and curve found at `path` (see the module doc)."""
    p = Path(path)
    if not p.exists():
        raise MissingFileError("does not exist", path=str(p))
    if _holds_adapter(p):
        side = Side(label, p, "adapter", adapter=p)
        run_dir = p if p.is_dir() else p.parent
        if (run_dir / "trainer_state.json").is_file() or (run_dir / "runs").is_dir():
            side.kind = "run"
            _try_curve(run_dir, side)
        elif (state := _newest_trainer_state(run_dir)) is not None:
            # The final adapter `trainer.save_model()` leaves at the top of
            # an output dir: the run's log is its newest checkpoint's state.
            side.kind = "run"
            _try_curve(state.parent, side)
        return side
    found = _core.discover([p])
    if not found.targets:
        raise MissingFileError(
            "holds no adapter and no training run adapterprobe can read", path=str(p)
        )
    target = found.targets[0]
    if len(found.targets) > 1:
        raise MissingFileError(
            f"holds {len(found.targets)} stores; compare them one by one "
            f"(e.g. {found.targets[0].store})",
            path=str(p),
        )
    side = Side(label, p, "store")
    adapters = [v for v in target.versions if _holds_adapter(Path(v))]
    if adapters:
        side.adapter = Path(adapters[-1])
    else:
        side.notes.append("no adapter weights in this store")
    drift = _core.drift_input(target.store)
    if drift.curve is not None:
        side.curve = drift.curve
        side.drift = drift
    elif drift.error is not None:
        side.notes.append(f"no loss curve: {drift.error}")
    elif drift.note:
        side.notes.append(f"no loss curve: {drift.note}")
    return side


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def first_step_at_or_below(steps: list[int], values: list[float], level: float) -> int | None:
    """The first step whose value is at or below `level` (None if never)."""
    for s, v in zip(steps, values, strict=False):
        if math.isfinite(v) and v <= level:
            return int(s)
    return None


def curve_summary(curve: Any) -> dict[str, Any]:
    """Best and final loss and where, eval loss, and sampled points."""
    steps = [int(s) for s in curve.steps.tolist()]
    losses = [float(v) for v in curve.losses.tolist()]
    finite = [(s, v) for s, v in zip(steps, losses, strict=True) if math.isfinite(v)]
    best = min(finite, key=lambda p: (p[1], p[0])) if finite else None
    final = finite[-1] if finite else None
    evals = [(int(s), float(v)) for s, v in curve.eval_loss]
    eval_finite = [(s, v) for s, v in evals if math.isfinite(v)]
    eval_best = min(eval_finite, key=lambda p: (p[1], p[0])) if eval_finite else None
    robust = curve.robust()
    return {
        "source": curve.source,
        "best_trend_loss": _finite(robust.best_level) if robust is not None else None,
        "points": len(steps),
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "best_loss": _finite(best[1]) if best else None,
        "best_step": best[0] if best else None,
        "final_loss": _finite(final[1]) if final else None,
        "final_step": final[0] if final else None,
        "eval_loss": [[s, _finite(v)] for s, v in evals],
        "best_eval_loss": eval_best[1] if eval_best else None,
        "best_eval_step": eval_best[0] if eval_best else None,
        "final_eval_loss": _finite(evals[-1][1]) if evals else None,
        "sample": [[int(s), _finite(v)] for s, v in curve.sample(CURVE_POINTS)],
    }


def step_to_level(curve: Any, level: float, *, trend: bool) -> int | None:
    """The first step at which the curve's robust trend (with `trend`) or its
    raw loss is at or below `level`."""
    steps = [int(s) for s in curve.steps.tolist()]
    robust = curve.robust() if trend else None
    values = [float(v) for v in robust.trend] if robust is not None else []
    if len(values) != len(steps):
        values = [float(v) for v in curve.losses.tolist()]
    return first_step_at_or_below(steps, values, level)


def adapter_summary(path: Path) -> dict[str, Any]:
    """Rank, rank used and ‖ΔW‖ per module and per layer of one adapter."""
    w = _core.read_adapter_weights(path)
    modules = [
        {
            "module": m.name,
            "layer": m.layer,
            "rank": m.rank,
            "rank_used": m.rank_used,
            "delta_fro": _finite(m.delta_fro),
        }
        for m in w.modules
    ]
    norms = [m.delta_fro for m in w.modules if m.delta_fro is not None]
    used = [m.rank_used for m in w.modules if m.rank_used is not None]
    return {
        "path": str(w.path),
        "rank": w.config.r
        if w.config is not None
        else max((m.rank for m in w.modules), default=None),
        "rank_used_max": max(used, default=None),
        # hypot: a norm near the float range gives inf, not an OverflowError
        "delta_fro": _finite(math.hypot(*norms)) if norms else None,
        "modules": modules,
        "layers": [
            {"layer": e.layer, "delta_fro": _finite(math.sqrt(e.delta_fro_sq))} for e in w.layers
        ],
        "nonfinite": w.nonfinite_total,
    }


MAX_STATE_BYTES = 64 << 20  # trainer_state.json larger than this is not read


def _newest_trainer_state(path: Path) -> Path | None:
    """The trainer_state.json of `path` or of its newest checkpoint-N."""
    base = path if path.is_dir() else path.parent
    if (base / "trainer_state.json").is_file():
        return base / "trainer_state.json"
    steps = []
    for ckpt in base.glob("checkpoint-*"):
        tail = ckpt.name.removeprefix("checkpoint-")
        if tail.isdigit() and (ckpt / "trainer_state.json").is_file():
            steps.append((int(tail), ckpt / "trainer_state.json"))
    return max(steps)[1] if steps else None


def other_axes(side: Side) -> dict[str, list[list[float]]]:
    """Epoch (and input tokens, when logged) at each logged training step,
    from an HF run's trainer_state.json: ``{"epoch": [[step, epoch], ...],
    "tokens": [[step, tokens], ...]}``, at most CURVE_POINTS points each;
    empty when the run has none (other layouts log steps only)."""
    if side.kind != "run":
        return {}
    state = _newest_trainer_state(side.path)
    if state is None or state.stat().st_size > MAX_STATE_BYTES:
        return {}
    try:
        history = json.loads(state.read_text(encoding="utf-8")).get("log_history")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        side.notes.append(f"{state}: not readable for epochs")
        return {}
    axes: dict[str, list[list[float]]] = {"epoch": [], "tokens": []}
    for entry in history if isinstance(history, list) else []:
        if not isinstance(entry, dict) or "loss" not in entry:
            continue
        step = entry.get("step")
        if not isinstance(step, int):
            continue
        for key, name in (("epoch", "epoch"), ("num_input_tokens_seen", "tokens")):
            value = entry.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                axes[name].append([step, float(value)])
    out = {}
    for name, points in axes.items():
        if points:
            stride = max(1, math.ceil(len(points) / CURVE_POINTS))
            kept = points[::stride]
            if kept[-1] != points[-1]:
                kept.append(points[-1])
            out[name] = kept
    return out
