"""Judge a run while it trains: the ``training_drift`` rules, one record at a time.

A training loop (or a trainer callback) hands each logged record to
:meth:`Guard.observe` and gets the verdict so far. The rules are the
offline ones, run by the same Rust kernel; what changes mid-run is what
FAIL means. Offline it means "do not ship"; here it means "stop now", so a
FAIL that later records could undo (a loss above its start that may still
fall, early zero rewards) is held at WARN until the run ends, and only
findings nothing can take back (NaN weights, the loss non-finite at its
last three records, a loss far worse than a uniform guess) are FAIL while
training. :meth:`Guard.result` judges every record seen as
``training_drift`` judges the logged run, so after the last record the two
agree.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe._fs import atomic_write_text, checkpoint_folders
from adapterprobe.errors import UsageError
from adapterprobe.escape import terminal
from adapterprobe.probes.drift import KIND, DriftOptions
from adapterprobe.probes.options import resolve
from adapterprobe.probes.result import ProbeResult

__all__ = ["GUARD_FILE", "Guard", "output_classes_of"]

#: What a guard callback writes into the run's output directory.
GUARD_FILE = "adapterprobe-guard.json"

_STOP_LEVELS = {"warn": 1, "fail": 2}

log = logging.getLogger("adapterprobe.guard")


def say(message: str, *args: Any) -> None:
    """Log a guard line as a warning, on a line of its own: while a tqdm
    progress bar is drawn (the HF Trainer's, Lightning's), the console
    handlers write through ``tqdm.write``, which clears the bar first, so
    the line is not glued to the bar's end."""
    tqdm = sys.modules.get("tqdm")
    bars = getattr(getattr(tqdm, "tqdm", None), "_instances", None)
    if not bars:
        log.warning(message, *args)
        return
    from tqdm.contrib.logging import logging_redirect_tqdm  # type: ignore[import-untyped]

    with logging_redirect_tqdm():
        log.warning(message, *args)


def output_classes_of(config: Any) -> tuple[int | None, str]:
    """``(K, kind)`` for a Hugging Face model config: the labels of a
    classification head (unless it is a regression or multi-label head),
    else the vocabulary; ``(None, "vocabulary")`` when it names neither.
    The same reading the scan makes of a saved ``config.json``."""
    architectures = [str(a) for a in (getattr(config, "architectures", None) or [])]
    if any(a.endswith(("Classification", "ForMultipleChoice")) for a in architectures):
        problem = getattr(config, "problem_type", None)
        labels = getattr(config, "num_labels", None)
        if problem in ("regression", "multi_label_classification") or not isinstance(labels, int):
            return None, "labels"
        return (labels, "labels") if labels >= 2 else (None, "labels")
    text = getattr(config, "text_config", None)
    vocab = getattr(config, "vocab_size", None) or getattr(text, "vocab_size", None)
    return (vocab, "vocabulary") if isinstance(vocab, int) and vocab >= 2 else (None, "vocabulary")


def reached(verdict: str, stop_on: str) -> bool:
    """Whether ``verdict`` is at or past ``stop_on`` (``"warn"`` or ``"fail"``)."""
    return _STOP_LEVELS.get(verdict, 0) >= _STOP_LEVELS[stop_on]


def check_stop_on(stop_on: str) -> str:
    if stop_on not in _STOP_LEVELS:
        raise UsageError(f"stop_on must be 'warn' or 'fail', got {stop_on!r}")
    return stop_on


class Guard:
    """The drift rules judged online for one run.

    ``rules``: ``"robust"`` only. ``"sway"`` is refused: its thresholds
    judge a finished curve (a final/initial loss ratio), so mid-run they
    would call every unfinished run unconverged. ``options``: a
    :class:`DriftOptions` to judge with (its defaults when None).
    ``output_classes``: the K the loss is a cross-entropy over (the
    model's ``config.vocab_size``, or its number of labels with
    ``output_kind="labels"``), for the rules that compare the loss with
    ln(K). ``max_steps``: the optimizer steps the run is set for, so that a
    run that ends early is judged as its trainer state would be.

    ``observe`` costs a few microseconds (amortised: the record is stored
    in Rust and the rules run on a schedule that grows with the run; see
    ``benches/bench_guard.py``).

    A guard is safe to share between threads: a training loop may call
    :meth:`observe` while a metrics thread reads :attr:`verdict`,
    :attr:`findings` or :meth:`result`; each call sees the records of the
    calls that finished before it. :func:`copy.copy` (and ``deepcopy``) of a
    guard is an independent guard with the same records so far.
    """

    def __init__(
        self,
        rules: str = "robust",
        options: DriftOptions | None = None,
        *,
        output_classes: int | None = None,
        output_kind: str = "vocabulary",
        max_steps: int | None = None,
    ) -> None:
        resolved = resolve(DriftOptions, options, rules, {})
        if resolved.rules != "robust":
            raise UsageError(
                "the guard judges with rules='robust' only: rules='sway' judges a finished "
                "curve (its final/initial ratio), which a run still training is not"
            )
        if output_kind not in ("vocabulary", "labels"):
            raise UsageError(f"output_kind must be 'vocabulary' or 'labels', got {output_kind!r}")
        self.options = resolved
        self._adopt(
            _core.Guard(
                resolved,
                output_classes=output_classes,
                output_kind=output_kind,
                max_steps=max_steps,
            )
        )

    def _adopt(self, core: _core.Guard) -> None:
        self._core = core
        # The hot path: the bound Rust method itself, no Python frame between.
        self.observe = core.observe  # type: ignore[method-assign]

    def __copy__(self) -> Guard:
        twin = object.__new__(type(self))
        twin.options = self.options
        twin._adopt(self._core.copy())
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> Guard:
        return self.__copy__()  # the state is all in Rust, copied whole; options are frozen

    def observe(
        self,
        step: int,
        loss: float | None = None,
        grad_norm: float | None = None,
        learning_rate: float | None = None,
        eval_loss: float | None = None,
        reward: float | None = None,
    ) -> str:
        """Take one logged record (any of its values may be missing, e.g. an
        eval log) and return the verdict so far: ``"pass"``, ``"warn"`` or
        ``"fail"`` (stop now)."""
        return self._core.observe(step, loss, grad_norm, learning_rate, eval_loss, reward)

    def observe_gap(self, step: int, stats: Mapping[str, float]) -> str:
        """Take the GAP monitor's statistics of one sampled step (a
        :class:`~adapterprobe.GAPMonitor`'s ``latest``) and return the
        verdict so far. ``gap_monitor``'s rules judge its newest 64 records
        online: NaN/inf in the weights or activations, or in the gradients
        at two sampled steps in a row, and a layer's gradient norm
        ``explode_fail_ratio`` (100x) above its recent level and its peers,
        are FAIL (stop now); one step of non-finite gradients (a loss
        scaler's overflow) and the other findings are WARN."""
        return self._core.observe_gap(step, dict(stats))

    def observe_factors(
        self, step: int, init: str, modules: Sequence[tuple[int, int, float]]
    ) -> str:
        """Take the LoRA A factors of a live PEFT model at ``step``: each
        linear module's ``(rank, in_features, ||A||_F)``, and PEFT's
        ``init_lora_weights`` as ``init`` (``"true"``, ``"gaussian"``, ...).
        ``adapter_weights``' ``factors_blown_up`` rule judges them as it
        would the adapter saved now: A past 100x the scale PEFT gave it is
        a FAIL (a learning rate far too high for LoRA), past 20x a WARN.
        Returns the verdict so far (:func:`lora_factor_norms` reads a
        model)."""
        return self._core.observe_factors(step, init, list(modules))

    def rewind(self, step: int) -> str:
        """Roll the run back to ``step`` (its trainer restored the checkpoint
        saved there): every record after it is forgotten, as the trainer
        discarded those steps, and the records that follow are judged as a
        continuation of the kept timeline. A finding first seen after
        ``step`` goes with its records. Returns the verdict of what is kept."""
        return self._core.rewind(step)

    def set_max_steps(self, max_steps: int | None) -> None:
        """The plan the run is now set for (``max_steps``; None: none), as
        :meth:`result` judges it: a rolled-back run that skipped the data of
        its discarded steps ends that many steps sooner."""
        self._core.set_max_steps(max_steps)

    @property
    def verdict(self) -> str:
        """The verdict so far (as :meth:`observe` last returned it)."""
        return self._core.verdict

    @property
    def findings(self) -> list[dict[str, Any]]:
        """The findings so far: ``rule``, ``step`` (of the record at which
        it was first reported), ``verdict`` (online) and ``message``."""
        return self._core.findings

    @property
    def num_records(self) -> int:
        """Loss records taken (distinct steps)."""
        return self._core.num_records

    def result(self, name: str = KIND) -> ProbeResult:
        """Every record seen, judged as ``training_drift`` judges a logged
        run (offline FAIL semantics)."""
        return ProbeResult.judged(name, KIND, self._core.result())

    @classmethod
    def replay(
        cls, store_path: str | Path, rules: str = "robust", options: DriftOptions | None = None
    ) -> tuple[Guard, list[tuple[int, str]]]:
        """Replay a logged run record by record, as the guard would have seen
        it while training: the guard after its last record, and each change
        of its verdict as ``(step, verdict)``. The run's plan (``max_steps``)
        and its model's output count come from the store, as
        ``training_drift`` reads them. Raises :class:`UsageError` when the
        store holds no loss curve."""
        inputs = _core.drift_input(Path(store_path).expanduser().resolve())
        return cls.replay_input(inputs, rules, options)

    @classmethod
    def replay_input(
        cls, inputs: _core.DriftInput, rules: str = "robust", options: DriftOptions | None = None
    ) -> tuple[Guard, list[tuple[int, str]]]:
        """:meth:`replay` of a store whose logs are already read
        (``_core.drift_input``), for a caller that needs more of the read
        than the verdict (``adapterprobe watch`` stats the files it names)
        without reading the logs twice."""
        curve = inputs.curve
        if curve is None:
            why = inputs.error if inputs.error is not None else inputs.note or ""
            raise UsageError(f"{inputs.store} holds no loss curve to replay ({why})")
        classes = inputs.output_classes
        progress = curve.progress
        guard = cls(
            rules,
            options,
            output_classes=classes.count if classes is not None else None,
            output_kind=classes.kind if classes is not None else "vocabulary",
            max_steps=progress[1] if progress is not None else None,
        )
        columns: dict[int, dict[str, float]] = {}
        for step, loss in zip(curve.steps.tolist(), curve.losses.tolist(), strict=True):
            columns.setdefault(step, {})["loss"] = loss if math.isfinite(loss) else math.nan
        for key, points in (
            ("grad_norm", curve.grad_norm),
            ("learning_rate", curve.learning_rate),
            ("eval_loss", curve.eval_loss),
            ("reward", curve.reward),
        ):
            for step, value in points:
                columns.setdefault(step, {})[key] = value
        changes: list[tuple[int, str]] = []
        seen = "pass"
        for step in sorted(columns):
            now = guard.observe(step, **columns[step])
            if now != seen:
                changes.append((step, now))
                seen = now
        return guard, changes

    def report(
        self,
        stopped_at: int | None = None,
        last_good_checkpoint: str | None = None,
        recoveries: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """What a callback writes: the verdict, the records taken, the step
        the run was stopped at (None: it was not), the findings, where it
        was stopped the newest checkpoint saved before its first fault
        (None: none was), and each rollback a recovering callback made
        (``recoveries``, when it made any)."""
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "num_records": self.num_records,
            "stopped_at": stopped_at,
            "findings": self.findings,
        }
        if stopped_at is not None:
            out["last_good_checkpoint"] = last_good_checkpoint
        if recoveries:
            out["recoveries"] = recoveries
        return out

    def write(
        self,
        directory: str | Path,
        stopped_at: int | None = None,
        last_good_checkpoint: str | None = None,
        recoveries: list[dict[str, Any]] | None = None,
    ) -> Path:
        """Write :meth:`report` as JSON to ``directory/GUARD_FILE``, atomically.

        The name is the guard's own choice inside a folder it did not make (a
        run's output folder, perhaps resumed from a shared or downloaded
        checkpoint): a symbolic link standing at it is replaced by the new
        file, never written through, and what it pointed at is left alone."""
        report = self.report(stopped_at, last_good_checkpoint, recoveries)
        text = json.dumps(report, indent=2, allow_nan=False)
        return atomic_write_text(Path(directory) / GUARD_FILE, text + "\n", replace_link=True)

    def __repr__(self) -> str:
        return f"Guard({self.verdict}, {self.num_records} records)"


class GuardCallbackBase:
    """What every trainer's ``GuardCallback`` shares, whatever the trainer:
    its settings (checked when it is made, not at train time), the
    :class:`Guard` of the run in progress (``guard``), the step it stopped
    the run at (``stopped_at``), what stopping logs, and the verdict file.
    A trainer's callback feeds records to :meth:`_must_stop` and stops the
    run its own way when it answers True.

    ``monitor``: a :class:`~adapterprobe.GAPMonitor` (or a GAP callback
    holding one as ``.monitor``) whose newest statistics the guard judges
    too, with ``gap_monitor``'s rules (:meth:`Guard.observe_gap`), before
    each record."""

    #: "yes" where the trainer lets a callback skip a step from its loss
    #: before it is applied; otherwise why not.
    _batch_skip = "this trainer does not hand a callback the step's loss before the update"
    #: "yes" where the callback can roll the run back; otherwise why not.
    _recovery = "this trainer's callback cannot restore a checkpoint mid-run"

    def __init__(
        self,
        stop_on: str = "fail",
        save_on_stop: bool = True,
        rules: str = "robust",
        options: DriftOptions | None = None,
        monitor: Any = None,
        output_classes: int | None = None,
        output_kind: str = "vocabulary",
        *,
        on_fail: str = "stop",
        max_recoveries: int = 3,
        lr_factor: float = 0.5,
        skip_window: int = 0,
        skip_batch_above: float | None = None,
    ) -> None:
        self.stop_on = check_stop_on(stop_on)
        #: What a FAIL does: ``"stop"`` the run, or ``"recover"`` it (roll
        #: back to the newest checkpoint saved before the finding, lower the
        #: learning rate, go on), where the trainer's callback can.
        self.on_fail = check_on_fail(on_fail)
        if on_fail == "recover" and self._recovery != "yes":
            raise UsageError(f"on_fail='recover' is not offered here: {self._recovery}")
        if isinstance(max_recoveries, bool) or not isinstance(max_recoveries, int):
            raise UsageError(f"max_recoveries must be an int, got {max_recoveries!r}")
        if max_recoveries < 0:
            raise UsageError(f"max_recoveries must be 0 or more, got {max_recoveries}")
        if not isinstance(lr_factor, int | float) or not 0 < lr_factor <= 1:
            raise UsageError(f"lr_factor must be in (0, 1], got {lr_factor!r}")
        if isinstance(skip_window, bool) or not isinstance(skip_window, int) or skip_window < 0:
            raise UsageError(f"skip_window must be an int, 0 or more, got {skip_window!r}")
        if skip_batch_above is not None and (
            isinstance(skip_batch_above, bool)
            or not isinstance(skip_batch_above, int | float)
            or not 0 < skip_batch_above < math.inf
        ):
            raise UsageError(
                f"skip_batch_above must be a positive number of sigmas, got {skip_batch_above!r}"
            )
        if skip_batch_above is not None and self._batch_skip != "yes":
            raise UsageError(f"skip_batch_above is not offered here: {self._batch_skip}")
        #: Skip an optimizer step whose loss is this many robust standard
        #: deviations above the recent applied steps' median (None: never).
        self.skip_batch_above = skip_batch_above
        self.max_recoveries = max_recoveries
        self.lr_factor = float(lr_factor)
        self.skip_window = skip_window
        #: Each rollback made so far (what the guard file lists).
        self.recoveries: list[dict[str, Any]] = []
        self.save_on_stop = save_on_stop
        self.rules = rules
        self.options = options
        self.monitor = monitor
        #: K the loss is a cross-entropy over, given by hand; None: read from
        #: the model the trainer holds, where it says.
        self.output_classes = output_classes
        self.output_kind = output_kind
        self.guard: Guard | None = None
        self.stopped_at: int | None = None
        #: Where a stopped run can be resumed from: the newest checkpoint
        #: saved before its first fault (set by callbacks that know where).
        self.last_good_checkpoint: str | None = None
        self._gap_seen: int | None = None
        self._announced: set[str] = set()
        self._said_verdict = "pass"
        #: The step of the first loss record after the newest rollback.
        self._first_after_rollback: int | None = None
        #: Steps up to this one (the trainer's numbering) apply no update:
        #: a rollback's ``skip_window``.
        self._skip_until = -1
        # refuse bad rules, options or classes now, not at train time
        Guard(rules, options, output_classes=output_classes, output_kind=output_kind)

    def _start(
        self,
        *,
        output_classes: int | None = None,
        output_kind: str = "vocabulary",
        max_steps: int | None = None,
    ) -> None:
        """A fresh guard for the run that starts; K given to the callback
        wins over K read from the model."""
        if self.output_classes is not None:
            output_classes, output_kind = self.output_classes, self.output_kind
        self.guard = Guard(
            self.rules,
            self.options,
            output_classes=output_classes,
            output_kind=output_kind,
            max_steps=max_steps,
        )
        self.stopped_at = None
        self.last_good_checkpoint = None
        self.recoveries = []
        self._first_after_rollback = None
        self._skip_until = -1
        self._gap_seen = None
        self._announced = set()
        self._said_verdict = "pass"

    def _announce_new_findings(self, step: int) -> None:
        """Say each finding once, when first reported, while the run goes
        on: a WARN is worth a line in the training log, not only in the
        verdict file."""
        if self.guard is None:
            return
        verdict = self.guard.verdict
        if verdict != self._said_verdict:
            say(
                "adapterprobe guard: verdict %s at step %d (was %s)",
                verdict.upper(),
                step,
                self._said_verdict.upper(),
            )
            self._said_verdict = verdict
        for finding in self.guard.findings:
            if finding["rule"] in self._announced or finding["verdict"] not in ("warn", "fail"):
                continue
            self._announced.add(finding["rule"])
            say(
                "adapterprobe guard: %s %s at step %d (the run goes on): %s",
                finding["verdict"].upper(),
                terminal(finding["rule"]),
                finding["step"],
                terminal(finding["message"]),
            )

    def _first_fault_step(self) -> int | None:
        """The step at which the findings that stopped the run were first
        seen (the earliest of the FAIL ones, else of any)."""
        if self.guard is None:
            return None
        findings = self.guard.findings
        fails = [f["step"] for f in findings if f["verdict"] == "fail"]
        steps = fails or [f["step"] for f in findings]
        return min(steps) if steps else None

    def _saves_at_stop(self, share: Callable[[bool], bool] | None = None) -> bool | None:
        """Whether a checkpoint is saved at the stop: True with
        ``save_on_stop``; False where what stopped the run says the weights
        are NaN/inf, so that no save is made, not even one the trainer's own
        schedule has due at this step (a checkpoint of NaN weights is of no
        use, and it would be the newest, the one a resume picks; said in the
        log); None otherwise (no save of ours; the trainer's schedule
        stands). Saving is a collective under DDP, so every rank takes rank
        0's answer (``share``)."""
        nan_weights = self.guard is not None and any(
            f["verdict"] == "fail" and f["rule"] in NAN_WEIGHT_RULES for f in self.guard.findings
        )
        if share is not None:
            nan_weights = share(nan_weights)
        if nan_weights:
            say("adapterprobe guard: not saving a checkpoint at the stop: the weights are NaN/inf")
            return False
        return True if self.save_on_stop else None

    def _must_stop(
        self,
        step: int,
        share: Callable[[Any], Any] | None = None,
        **values: float | None,
    ) -> bool:
        """Observe one record; True (once) when the verdict reaches
        ``stop_on``, after logging the findings. A recovering callback
        calls :meth:`_reached` and :meth:`_stop_now` apart, with its
        rollback between them."""
        if not self._reached(step, share, **values):
            return False
        self._stop_now(step)
        return True

    def _reached(
        self,
        step: int,
        share: Callable[[Any], Any] | None = None,
        **values: float | None,
    ) -> bool:
        """Observe one record; True when the verdict reaches ``stop_on``
        (a new finding or verdict is logged while it does not).

        Under DDP/FSDP each rank may see other values (Lightning's per-rank
        loss), so a trainer passes ``share``: a collective that hands rank
        0's decision (any picklable object) to every rank. Every rank then
        stops at the same step, the one rank 0 chose. ``share`` is called on
        every record, on every rank, until the run is stopped."""
        if self.guard is None or self.stopped_at is not None:
            return False
        first_since_rollback = self.recoveries and self._first_after_rollback is None
        if first_since_rollback and values.get("loss") is not None:
            self._first_after_rollback = step
        monitor = self.monitor
        if monitor is not None and not hasattr(monitor, "latest_step"):
            monitor = getattr(monitor, "monitor", None)  # a GAP callback's monitor
        latest = None if monitor is None else monitor.latest_step
        if latest is not None and latest != self._gap_seen:  # a sampled step not judged yet
            self._gap_seen = latest
            self.guard.observe_gap(latest, monitor.latest)
        verdict = self.guard.observe(step, **values)
        stop = reached(verdict, self.stop_on)
        if share is not None:
            stop = bool(share(stop))
        if not stop:
            self._announce_new_findings(step)
        return stop

    def _stop_now(self, step: int) -> None:
        """Mark the run stopped at ``step`` and log why."""
        if self.guard is None:
            return
        self.stopped_at = step
        for finding in self.guard.findings:
            say(
                "adapterprobe guard: %s at step %d: %s",
                terminal(finding["rule"]),
                finding["step"],
                terminal(finding["message"]),
            )
        say(
            "adapterprobe guard: stopping the run at step %d (verdict %s)", step, self.guard.verdict
        )
        self._said_verdict = self.guard.verdict

    def _say_final(self) -> None:
        """The verdict at the end of the run, on a line of its own."""
        if self.guard is None:
            return
        rolled = f", {len(self.recoveries)} rollback(s)" if self.recoveries else ""
        stopped = f", stopped at step {self.stopped_at}" if self.stopped_at is not None else ""
        say(
            "adapterprobe guard: verdict at the end of training: %s (%d records%s%s)",
            self.guard.verdict.upper(),
            self.guard.num_records,
            stopped,
            rolled,
        )

    def _can_recover(self) -> bool:
        """Whether this FAIL is one a rollback is for: ``on_fail="recover"``,
        recoveries left, and the verdict FAIL (a WARN that reached
        ``stop_on="warn"`` stops). Says why not when recovery was asked
        for."""
        if self.on_fail != "recover" or self.guard is None or self.guard.verdict != "fail":
            return False
        if len(self.recoveries) >= self.max_recoveries:
            say(
                "adapterprobe guard: not recovering: the run was rolled back %d time(s) "
                "already (max_recoveries=%d)",
                len(self.recoveries),
                self.max_recoveries,
            )
            return False
        return True

    def _observe_factors(self, step: int, model: Any) -> None:
        """The live LoRA factor check (:meth:`Guard.observe_factors`) on
        ``model`` when it is a PEFT LoRA; nothing otherwise."""
        if self.guard is None or self.stopped_at is not None:
            return
        read = lora_factor_norms(model)
        if read is not None:
            self.guard.observe_factors(step, *read)

    def _look_before(self, first_fault: int) -> int:
        """The step the checkpoint to restore must come before: the first
        fault's, unless the run went wrong again at its first record after
        the newest rollback, which says the weights restored then were
        already bad (saved after the damage began): then before that
        checkpoint too."""
        last = self.recoveries[-1] if self.recoveries else None
        after = self._first_after_rollback
        if last is not None and after is not None and first_fault <= after:
            return min(first_fault, int(last["checkpoint_step"]))
        return first_fault

    def _agreed_plan(
        self,
        share: Callable[[Any], Any] | None,
        plan_for: Callable[[int], tuple[str, int] | str],
    ) -> tuple[str, int] | None:
        """The rollback every rank makes: ``plan_for(first fault step)``
        gives the checkpoint and its step, or why there is none (said, and
        the run is stopped); rank 0's plan is handed to every rank
        (``share``). None: no rollback."""
        plan: tuple[str, int] | str | None = None
        first_fault = self._first_fault_step()
        if self._can_recover() and first_fault is not None:
            plan = plan_for(first_fault)
            if isinstance(plan, str):
                say("adapterprobe guard: not recovering: %s", terminal(plan))
        if share is not None:
            plan = share(plan)
        return plan if isinstance(plan, tuple) and self.guard is not None else None

    def _next_lr_scale(self) -> float:
        """The learning rate's scale after the rollback about to be made."""
        return self.lr_factor ** (len(self.recoveries) + 1)

    def _rewound(
        self,
        *,
        from_step: int,
        to_step: int,
        checkpoint: str,
        checkpoint_step: int,
        max_steps: int | None,
    ) -> dict[str, Any]:
        """After a trainer restored ``checkpoint`` (saved after
        ``checkpoint_step`` steps; ``to_step`` is the last step of the kept
        timeline in the trainer's numbering): the guard forgets the
        discarded steps and judges on as a continuation, the next
        ``skip_window`` steps apply no update, and the rollback is logged and
        kept for the guard file. Returns its record (as listed under
        ``recoveries``)."""
        assert self.guard is not None
        record: dict[str, Any] = {
            "from_step": from_step,
            "to_step": to_step,
            "checkpoint": checkpoint,
            "checkpoint_step": checkpoint_step,
            "first_bad_step": self._first_fault_step(),
            "findings": [f for f in self.guard.findings if f["verdict"] == "fail"],
            "lr_scale": self._next_lr_scale(),
            "skip_window": self.skip_window,
        }
        self._skip_until = to_step + self.skip_window
        self.guard.rewind(to_step)
        self.guard.set_max_steps(max_steps)
        self.recoveries.append(record)
        self._first_after_rollback = None
        self._announced = {f["rule"] for f in self.guard.findings}
        self._said_verdict = self.guard.verdict
        window = record["skip_window"]
        say(
            "adapterprobe guard: recovered (%d of at most %d): rolled back from step %d to %s "
            "(step %d), learning rate x%g; the batches of the %d discarded step(s) are skipped%s",
            len(self.recoveries),
            self.max_recoveries,
            record["from_step"],
            terminal(str(record["checkpoint"])),
            to_step,
            record["lr_scale"],
            record["from_step"] - to_step,
            f", and the next {window} step(s) apply no update" if window else "",
        )
        return record

    def _write(self, directory: str | Path, *, main_process: bool) -> None:
        """The verdict file, from the main process only."""
        if self.guard is not None and main_process:
            self.guard.write(
                directory,
                stopped_at=self.stopped_at,
                last_good_checkpoint=self.last_good_checkpoint,
                recoveries=self.recoveries,
            )


_ON_FAIL = ("stop", "recover")

#: Most LoRA modules a live factor check reads (a 70B with every linear
#: adapted has under 600 per adapter).
MAX_LORA_MODULES = 100_000


def lora_factor_norms(model: Any) -> tuple[str, list[tuple[int, int, float]]] | None:
    """The live factor check's input from a PEFT model: its active
    adapter's ``init_lora_weights`` as text, and each linear module's
    ``(rank, in_features, ||A||_F)``, read with one host sync; None for a
    model that is no PEFT LoRA, or whose factors are sharded (FSDP), where
    a norm of the local shard would not be the module's."""
    configs = getattr(model, "peft_config", None)
    adapter = getattr(model, "active_adapter", None)
    if not isinstance(configs, Mapping) or not isinstance(adapter, str):
        return None
    init = getattr(configs.get(adapter), "init_lora_weights", None)
    if init is None:
        return None
    init_text = str(init).lower() if isinstance(init, bool) else str(init)
    import torch  # the trainer has it; a callback only

    weights = []
    for module in itertools.islice(model.modules(), MAX_LORA_MODULES * 8):
        factors = getattr(module, "lora_A", None)
        if not isinstance(factors, torch.nn.ModuleDict) or adapter not in factors:
            continue
        weight = getattr(factors[adapter], "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue  # a conv LoRA: the rule reads linear modules only
        if type(weight).__name__ == "DTensor" or weight.numel() == 0:
            return None
        weights.append(weight)
        if len(weights) >= MAX_LORA_MODULES:
            break
    if not weights:
        return None
    with torch.no_grad():
        norms = torch.stack(
            [torch.linalg.vector_norm(w.detach().float()).to("cpu") for w in weights]
        ).tolist()
    shapes = [(int(w.shape[0]), int(w.shape[1])) for w in weights]
    return init_text, [(r, n, float(v)) for (r, n), v in zip(shapes, norms, strict=True)]


def drop_gradients(optimizer: Any) -> None:
    """Make the optimizer's next step apply no update: torch's optimizers
    pass over parameters whose gradient is None."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            parameter.grad = None


def base_learning_rates(scheduler: Any) -> list[float] | None:
    """A scheduler's base learning rates (``base_lrs``: what its schedule
    multiplies), as they are when training begins; None when it has none.
    Accelerate's wrapper is looked through."""
    scheduler = getattr(scheduler, "scheduler", scheduler)
    base = getattr(scheduler, "base_lrs", None)
    return [float(b) for b in base] if isinstance(base, list) else None


def scale_learning_rate(
    optimizer: Any, scheduler: Any, base_lrs: list[float] | None, scale: float
) -> None:
    """Set a restored run's learning rate to ``scale`` times its schedule:
    the scheduler's base rates become ``base_lrs`` (the run's first) times
    ``scale``, and each group's current rate moves by the same ratio, so the
    schedule keeps its shape. A checkpoint saved after an earlier rollback
    already holds a scaled rate; this sets the scale, never compounds it.
    Without base rates (a scheduler that has none): each group's rate times
    ``scale``."""
    scheduler = getattr(scheduler, "scheduler", scheduler)  # accelerate's wrapper
    groups = optimizer.param_groups
    loaded = getattr(scheduler, "base_lrs", None)
    if base_lrs is None or not isinstance(loaded, list) or len(loaded) != len(groups):
        for group in groups:
            group["lr"] = group["lr"] * scale
        return
    for i, group in enumerate(groups):
        target = base_lrs[i] * scale
        ratio = target / loaded[i] if loaded[i] else scale
        loaded[i] = target
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:
            group["initial_lr"] = target
    if scheduler is not None and hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [group["lr"] for group in groups]


def check_on_fail(on_fail: str) -> str:
    if on_fail not in _ON_FAIL:
        raise UsageError(f"on_fail must be 'stop' or 'recover', got {on_fail!r}")
    return on_fail


#: FAIL rules that mean the weights themselves are NaN/inf.
NAN_WEIGHT_RULES = frozenset({"nan_masked", "nonfinite_loss", "nonfinite"})


def last_checkpoint_before(output_dir: str | Path, step: int) -> str | None:
    """The newest ``checkpoint-N`` folder in ``output_dir`` with ``N`` before
    ``step`` (the HF Trainer's layout), by name; None when there is none."""
    before = [(n, p) for n, p in checkpoint_folders(output_dir) if n < step and os.path.isdir(p)]
    if not before:
        return None
    return os.path.basename(max(before, key=lambda c: c[0])[1])
