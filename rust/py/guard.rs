//! `_core.Guard`: the online drift rules (`verdicts::guard`) for Python's
//! `adapterprobe.Guard`. Conversion only; `observe` is the hot path (a
//! training loop calls it once per logged record), so it takes plain
//! optional floats and returns a static string.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::verdicts::judged_tuple;
use crate::formats::model_config::OutputClasses;
use crate::verdicts::drift::DriftOptions;
use crate::verdicts::guard;

#[pyclass(module = "adapterprobe._core", name = "Guard")]
struct Guard {
    inner: guard::Guard,
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
        });
        let mut inner = guard::Guard::new(options, classes);
        inner.set_max_steps(max_steps);
        Guard { inner }
    }

    #[pyo3(signature = (step, loss=None, grad_norm=None, learning_rate=None, eval_loss=None, reward=None))]
    fn observe(
        &mut self,
        step: i64,
        loss: Option<f64>,
        grad_norm: Option<f64>,
        learning_rate: Option<f64>,
        eval_loss: Option<f64>,
        reward: Option<f64>,
    ) -> &'static str {
        self.inner
            .observe(step, loss, grad_norm, learning_rate, eval_loss, reward)
            .as_str()
    }

    /// The GAP monitor's statistics of one sampled step; the verdict so far.
    fn observe_gap(&mut self, step: i64, stats: HashMap<String, f64>) -> &'static str {
        let mut stats: Vec<(String, f64)> = stats.into_iter().collect();
        stats.sort_by(|a, b| a.0.cmp(&b.0)); // a stable order for the messages
        self.inner.observe_gap(step, stats).as_str()
    }

    #[getter]
    fn verdict(&self) -> &'static str {
        self.inner.verdict().as_str()
    }

    #[getter]
    fn num_records(&self) -> usize {
        self.inner.num_records()
    }

    #[getter]
    fn findings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for f in self.inner.findings() {
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
        let judged = py.detach(|| self.inner.result());
        judged_tuple(py, &judged)
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Guard>()
}
