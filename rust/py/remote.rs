//! Bindings of remote roots (`crate::remote`): staging an object-store
//! prefix as a sparse local tree, and what was fetched for it.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::Result;

/// (objects, bytes listed, LIST requests, problems as (URL, why)).
type Staged = (usize, u64, u64, Vec<(String, String)>);

/// Stage the remote root `url` in the empty directory `dir` (listing it;
/// files are fetched by range on first read).
#[pyfunction]
fn remote_stage(py: Python<'_>, url: &str, dir: PathBuf) -> Result<Staged> {
    let s = py.detach(|| crate::remote::stage(url, &dir))?;
    Ok((s.objects, s.bytes_listed, s.list_requests, s.problems))
}

/// (path, bytes, requests) fetched for each file read under the staged `dir`.
#[pyfunction]
fn remote_fetched(dir: PathBuf) -> Vec<(PathBuf, u64, u64)> {
    let all = crate::remote::fetched(&dir);
    all.into_iter()
        .map(|f| (f.path, f.bytes, f.requests))
        .collect()
}

/// Forget the staged `dir` (its files are no longer fetched).
#[pyfunction]
fn remote_release(dir: PathBuf) {
    crate::remote::release(&dir);
}

/// Whether sha256 sidecars of remote files are checked
/// (`ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS`), as the readers decide it.
#[pyfunction]
fn remote_checksums_verified() -> bool {
    crate::io::sidecar::verify_remote_checksums()
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(remote_stage, m)?)?;
    m.add_function(wrap_pyfunction!(remote_fetched, m)?)?;
    m.add_function(wrap_pyfunction!(remote_release, m)?)?;
    m.add_function(wrap_pyfunction!(remote_checksums_verified, m)?)?;
    Ok(())
}
