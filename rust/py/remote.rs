//! Bindings of remote roots (`crate::remote`): staging an object-store
//! prefix as a sparse local tree, and what was fetched for it. Built
//! without the `object-store` feature, the same functions exist: staging
//! says how to get a build that reads object stores, and nothing is ever
//! fetched.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::Result;

/// (objects, bytes listed, LIST requests, problems as (URL, why)).
type Staged = (usize, u64, u64, Vec<(String, String)>);

/// Stage the remote root `url` in the empty directory `dir` (listing it;
/// files are fetched by range on first read).
#[cfg(feature = "object-store")]
#[pyfunction]
fn remote_stage(py: Python<'_>, url: &str, dir: PathBuf) -> Result<Staged> {
    let s = py.detach(|| crate::remote::stage(url, &dir))?;
    Ok((s.objects, s.bytes_listed, s.list_requests, s.problems))
}

/// This build cannot read object stores: say so, and how to get one that can.
#[cfg(not(feature = "object-store"))]
#[pyfunction]
fn remote_stage(url: &str, dir: PathBuf) -> Result<Staged> {
    let _ = dir;
    Err(crate::Error::new(
        crate::error::Area::Usage,
        std::path::Path::new(url),
        "this adapterprobe was built without object-store support (the cargo feature \
         `object-store`, which release wheels enable); rebuild from the checkout with \
         `maturin develop --release --features python,object-store`, or copy the \
         stores to a local disk",
    ))
}

/// (path, bytes, requests) fetched for each file read under the staged `dir`.
#[pyfunction]
fn remote_fetched(dir: PathBuf) -> Vec<(PathBuf, u64, u64)> {
    #[cfg(feature = "object-store")]
    {
        let all = crate::remote::fetched(&dir);
        all.into_iter()
            .map(|f| (f.path, f.bytes, f.requests))
            .collect()
    }
    #[cfg(not(feature = "object-store"))]
    {
        let _ = dir;
        Vec::new()
    }
}

/// Forget the staged `dir` (its files are no longer fetched).
#[pyfunction]
fn remote_release(dir: PathBuf) {
    #[cfg(feature = "object-store")]
    crate::remote::release(&dir);
    #[cfg(not(feature = "object-store"))]
    let _ = dir;
}

/// Whether this build reads object stores (the `object-store` feature).
#[pyfunction]
fn remote_supported() -> bool {
    cfg!(feature = "object-store")
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
    m.add_function(wrap_pyfunction!(remote_supported, m)?)?;
    Ok(())
}
