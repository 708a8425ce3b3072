//! The text Python shows for a path and an error a Rust value hands it.

use std::path::Path;

use crate::Error;

/// The parts of a POSIX path as `pathlib.PurePosixPath` parses them: the
/// root (`""`, `"/"`, or `"//"` for exactly two leading slashes) and the
/// names, with empty and `.` parts dropped.
fn posix_parts(path: &Path) -> (&'static str, Vec<String>) {
    let text = path.to_string_lossy();
    let root = if text.starts_with("//") && !text.starts_with("///") {
        "//"
    } else if text.starts_with('/') {
        "/"
    } else {
        ""
    };
    let parts = text
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .map(str::to_string)
        .collect();
    (root, parts)
}

/// `str(pathlib.Path(path))` on POSIX: the text Python shows for a path a
/// Rust value hands it (`a//b/./c/` is `a/b/c`, an empty path `.`).
pub fn path_str(path: &Path) -> String {
    let (root, parts) = posix_parts(path);
    let joined = parts.join("/");
    if root.is_empty() && joined.is_empty() {
        ".".to_string()
    } else {
        format!("{root}{joined}")
    }
}

/// `pathlib.Path(path).name`: the last name, `""` for a bare root or `.`.
pub fn path_name(path: &Path) -> String {
    let (_, parts) = posix_parts(path);
    parts.last().cloned().unwrap_or_default()
}

/// `str(error)` of an error the Rust core hands Python (`"<path>:
/// <reason>"`, the path as pathlib shows it), or `"None"` for none.
pub fn error_str(error: Option<&Error>) -> String {
    match error {
        None => "None".to_string(),
        Some(e) if e.path.as_os_str().is_empty() => e.message.clone(),
        Some(e) => format!("{}: {}", path_str(&e.path), e.message),
    }
}
