//! Bindings of the update comparison and the near-duplicate search:
//! conversion only (results as plain dicts or the core's own classes), the
//! GIL released around every read and computation.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::analysis::adapter_weights::FactorFile;
use crate::analysis::update_similarity::{self, ModuleSimilarity, UpdateComparison};
use crate::store::similar::{self, SimilarPair, SimilarReport, SkippedAdapter};
use crate::Result;

/// A float, or None where it is NaN (undefined).
fn defined(x: f64) -> Option<f64> {
    (!x.is_nan()).then_some(x)
}

fn module_dict<'py>(py: Python<'py>, m: &ModuleSimilarity) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("module", &m.module)?;
    d.set_item("layer", m.layer)?;
    d.set_item("cosine", defined(m.cosine))?;
    d.set_item("rank_a", m.rank_a)?;
    d.set_item("rank_b", m.rank_b)?;
    d.set_item("in_features", m.in_features)?;
    d.set_item("out_features", m.out_features)?;
    d.set_item("norm_a", defined(m.norm_a))?;
    d.set_item("norm_b", defined(m.norm_b))?;
    d.set_item("inner", defined(m.inner))?;
    d.set_item("principal_angles_deg", &m.principal_angles_deg)?;
    Ok(d)
}

fn comparison_dict<'py>(py: Python<'py>, c: &UpdateComparison) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("path_a", &c.path_a)?;
    d.set_item("path_b", &c.path_b)?;
    d.set_item("similarity", defined(c.similarity))?;
    let modules = PyList::empty(py);
    for m in &c.modules {
        modules.append(module_dict(py, m)?)?;
    }
    d.set_item("modules", modules)?;
    let left = PyList::empty(py);
    for l in &c.left_out {
        let e = PyDict::new(py);
        e.set_item("module", &l.module)?;
        e.set_item("reason", &l.reason)?;
        left.append(e)?;
    }
    d.set_item("left_out", left)?;
    d.set_item("energy_a", c.energy_a)?;
    d.set_item("energy_b", c.energy_b)?;
    d.set_item("scaled", c.scaled)?;
    Ok(d)
}

/// Compare two adapters' updates module by module (see
/// `analysis::update_similarity`); a dict, NaN as None.
#[pyfunction]
#[pyo3(signature = (a, b, *, angles = true))]
fn compare_adapter_updates(
    py: Python<'_>,
    a: PathBuf,
    b: PathBuf,
    angles: bool,
) -> PyResult<Py<PyDict>> {
    let result: Result<UpdateComparison> = py.detach(|| {
        let x = FactorFile::open(&a)?;
        let y = FactorFile::open(&b)?;
        update_similarity::compare_adapters(&x, &y, angles)
    });
    Ok(comparison_dict(py, &result?)?.unbind())
}

/// Adapter directories under `root`.
#[pyfunction]
fn find_adapters(py: Python<'_>, root: PathBuf) -> Result<Vec<PathBuf>> {
    py.detach(|| similar::find_adapters(&root))
}

/// Near-duplicate pairs among the adapters under `root`, or among `paths`.
#[pyfunction]
#[pyo3(signature = (root = None, *, paths = None, threshold = 0.99, exhaustive = false, max_pairs = 10000, all_checkpoints = false))]
#[allow(clippy::too_many_arguments)]
fn similar_adapters(
    py: Python<'_>,
    root: Option<PathBuf>,
    paths: Option<Vec<PathBuf>>,
    threshold: f64,
    exhaustive: bool,
    max_pairs: usize,
    all_checkpoints: bool,
) -> Result<SimilarReport> {
    py.detach(|| match (root, paths) {
        (Some(root), None) => {
            similar::similar_under(&root, threshold, exhaustive, max_pairs, all_checkpoints)
        }
        (None, Some(paths)) => similar::similar_pairs(&paths, threshold, exhaustive, max_pairs),
        _ => Err(crate::Error::new(
            crate::Area::Usage,
            "",
            "give either a root or a list of adapter paths",
        )),
    })
}

#[pymethods]
impl SimilarPair {
    fn __repr__(&self) -> String {
        format!(
            "SimilarPair(a={:?}, b={:?}, similarity={})",
            self.a.display().to_string(),
            self.b.display().to_string(),
            self.similarity
        )
    }
}

#[pymethods]
impl SimilarReport {
    fn __repr__(&self) -> String {
        format!(
            "SimilarReport(pairs={}, adapters={}, groups={}, skipped={}, threshold={})",
            self.pairs.len(),
            self.adapters,
            self.groups,
            self.skipped.len(),
            self.threshold
        )
    }
}

#[pymethods]
impl SkippedAdapter {
    fn __repr__(&self) -> String {
        format!(
            "SkippedAdapter(path={:?}, reason={:?})",
            self.path.display().to_string(),
            self.reason
        )
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SimilarPair>()?;
    m.add_class::<SimilarReport>()?;
    m.add_class::<SkippedAdapter>()?;
    m.add_function(wrap_pyfunction!(compare_adapter_updates, m)?)?;
    m.add_function(wrap_pyfunction!(find_adapters, m)?)?;
    m.add_function(wrap_pyfunction!(similar_adapters, m)?)?;
    Ok(())
}
