//! `_core.Guard`: the online drift rules (`verdicts::guard`) for Python's
//! `adapterprobe.Guard`. Conversion only; `observe` is the hot path (a
//! training loop calls it once per logged record), so it takes plain
//! optional floats and returns a static string.
//!
//! Safe across threads: the class is frozen and its state sits behind a
//! mutex, taken only while the GIL is held and never across a release of
//! it, so a metrics thread reading `verdict` or calling `result()` while
//! the training loop calls `observe` waits its turn instead of raising
//! PyO3's "Already borrowed". `result()` judges a copy with the GIL
//! released, so training goes on meanwhile.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::verdicts::judged_tuple;
use crate::formats::model_config::OutputClasses;
use crate::verdicts::drift::DriftOptions;
use crate::verdicts::weights::factor_scale::FactorNorm;
use crate::verdicts::{batch_gate, guard};

#[pyclass(module = "adapterprobe._core", name = "Guard", frozen)]
struct Guard {
    inner: Mutex<guard::Guard>,
}

impl Guard {
    /// The state. A panic cannot leave it half-updated in a way later calls
    /// could not judge (each call rebuilds what it reports), so a poisoned
    /// lock is taken as it is.
    fn state(&self) -> MutexGuard<'_, guard::Guard> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl Guard {
    #[new]
    #[pyo3(signature = (options, *, output_classes=None, output_kind=None, max_steps=None))]
    fn new(
        options: DriftOptions,
        output_classes: Option<u64>,
        output_kind: Option<String>,
        max_steps: Option<i64>,
    ) -> Guard {
        let classes = output_classes.map(|count| OutputClasses {
            count,
            kind: output_kind.unwrap_or_else(|| "vocabulary".into()),
            path: std::path::PathBuf::new(),
            source: "the model's config".to_string(),
        });
        let mut inner = guard::Guard::new(options, classes);
        inner.set_max_steps(max_steps);
        Guard {
            inner: Mutex::new(inner),
        }
    }

    /// An independent guard with this one's records and findings so far
    /// (`copy.copy` and `copy.deepcopy` of `adapterprobe.Guard`).
    fn copy(&self) -> Guard {
        Guard {
            inner: Mutex::new(self.state().clone()),
        }
    }

    #[pyo3(signature = (step, loss=None, grad_norm=None, learning_rate=None, eval_loss=None, reward=None))]
    fn observe(
        &self,
        step: i64,
        loss: Option<f64>,
        grad_norm: Option<f64>,
        learning_rate: Option<f64>,
        eval_loss: Option<f64>,
        reward: Option<f64>,
    ) -> &'static str {
        self.state()
            .observe(step, loss, grad_norm, learning_rate, eval_loss, reward)
            .as_str()
    }

    /// The GAP monitor's statistics of one sampled step; the verdict so far.
    fn observe_gap(&self, step: i64, stats: HashMap<String, f64>) -> &'static str {
        let mut stats: Vec<(String, f64)> = stats.into_iter().collect();
        stats.sort_by(|a, b| a.0.cmp(&b.0)); // a stable order for the messages
        self.state().observe_gap(step, stats).as_str()
    }

    /// The live model's LoRA A factors at `step`: `(rank, in_features,
    /// ||A||_F)` of each linear module, PEFT's `init_lora_weights` as
    /// `init`; the verdict so far.
    fn observe_factors(
        &self,
        step: i64,
        init: &str,
        modules: Vec<(u64, u64, f64)>,
    ) -> &'static str {
        let modules = modules
            .into_iter()
            .map(|(rank, in_features, norm_a)| FactorNorm {
                rank,
                in_features,
                norm_a,
            })
            .collect();
        self.state().observe_factors(step, init, modules).as_str()
    }

    /// Forget every record after `step` (a run rolled back to it); the
    /// verdict of the timeline kept.
    fn rewind(&self, step: i64) -> &'static str {
        self.state().rewind(step).as_str()
    }

    /// The plan the run is now set for (a rolled-back run that skipped
    /// data ends sooner); None: no plan.
    #[pyo3(signature = (max_steps))]
    fn set_max_steps(&self, max_steps: Option<i64>) {
        self.state().set_max_steps(max_steps);
    }

    #[getter]
    fn verdict(&self) -> &'static str {
        self.state().verdict().as_str()
    }

    #[getter]
    fn num_records(&self) -> usize {
        self.state().num_records()
    }

    #[getter]
    fn findings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        let findings = self.state().findings();
        for f in findings {
            let d = PyDict::new(py);
            d.set_item("rule", f.rule.as_str())?;
            d.set_item("step", f.step)?;
            d.set_item("verdict", f.verdict.as_str())?;
            d.set_item("message", f.message.as_str())?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// Every record seen, judged as `training_drift` judges a logged run:
    /// `(verdict, score, raw, message, evidence)`.
    fn result<'py>(&self, py: Python<'py>) -> PyResult<super::verdicts::JudgedTuple<'py>> {
        let copy = self.state().clone();
        let judged = py.detach(move || copy.result());
        judged_tuple(py, &judged)
    }
}

/// `_core.BatchGate`: whether to apply an optimizer step, from its loss
/// (`verdicts::batch_gate`), for the guard's `skip_batch_above`.
#[pyclass(module = "adapterprobe._core", name = "BatchGate", frozen)]
struct BatchGate {
    inner: Mutex<batch_gate::BatchGate>,
}

#[pymethods]
impl BatchGate {
    #[new]
    fn new(sigmas: f64) -> PyResult<BatchGate> {
        if !(sigmas.is_finite() && sigmas > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "sigmas must be a positive number, got {sigmas}"
            )));
        }
        Ok(BatchGate {
            inner: Mutex::new(batch_gate::BatchGate::new(sigmas)),
        })
    }

    /// Whether to apply the step whose loss is `loss` (False: skip it).
    fn admit(&self, loss: f64) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(loss)
    }

    /// The loss above which a step is skipped now (None: not judging yet).
    #[getter]
    fn bar(&self) -> Option<f64> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bar()
    }

    #[getter]
    fn skipped(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .skipped()
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Guard>()?;
    m.add_class::<BatchGate>()
}
