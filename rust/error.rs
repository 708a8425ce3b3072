//! One error type for the whole core. Each variant names the area it came
//! from so the binding can raise the matching Python exception class, and
//! every message names the file involved.

use std::fmt;
use std::path::{Path, PathBuf};

/// Which part of the library rejected the input; the binding maps each
/// area to its own `AdapterProbeError` subclass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// A safetensors header that is truncated, oversized or malformed.
    Header,
    /// A training log that cannot be read as dlm JSONL.
    LogFormat,
    /// Adapter keys that cannot be attributed to transformer layers.
    LayerGrouping,
    /// A `training_state.pt` that is corrupt or of an unknown shape.
    TrainingState,
    /// A pickle that names a global outside the allow-list.
    UnsafePickle,
    /// A file whose sha256 disagrees with its recorded digest.
    Integrity,
    /// A file the caller asked for does not exist.
    Missing,
    /// Bad arguments from the caller (not bad data).
    Usage,
    /// Adapter weights (tensor data) or an `adapter_config.json` that is
    /// unreadable or disagrees with the weights.
    Weights,
}

/// An error with structured fields: the Python binding raises the area's
/// exception class with `path`, `reason` (the message) and the `details`
/// as attributes, so callers need not parse the text.
#[derive(Debug, Clone)]
pub struct Error {
    pub area: Area,
    /// The file or directory involved; empty when the error is about none.
    pub path: PathBuf,
    pub message: String,
    /// Facts specific to the error, e.g. `("global_name", "os.system")`.
    pub details: Vec<(&'static str, String)>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(area: Area, path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error {
            area,
            path: path.as_ref().to_path_buf(),
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The same error with one more structured detail.
    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.details.push((key, value.into()));
        self
    }

    /// Wrap an I/O failure, keeping "not found" distinct from the rest.
    pub fn io(area: Area, path: impl AsRef<Path>, err: &std::io::Error) -> Self {
        let path = path.as_ref();
        if err.kind() == std::io::ErrorKind::NotFound {
            return Error::new(Area::Missing, path, "no such file or directory");
        }
        Error::new(area, path, format!("cannot read: {err}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.as_os_str().is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path.display(), self.message)
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_file() {
        let e = Error::new(Area::Header, "/x/a.safetensors", "too short");
        assert_eq!(e.to_string(), "/x/a.safetensors: too short");
    }

    #[test]
    fn not_found_is_its_own_area() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(Error::io(Area::Header, "p", &io).area, Area::Missing);
        let io = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(Error::io(Area::Header, "p", &io).area, Area::Header);
    }
}
