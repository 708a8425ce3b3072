//! Paths as Python shows them: `str(pathlib.Path(p))`.
//!
//! Records name stores and versions by the text Python's `pathlib` makes of
//! the discovered path, so a record is the same whether Python or Rust
//! built it: repeated separators and `.` components dropped, no trailing
//! separator, a lone `.` for an empty relative path, and POSIX's special
//! pair of leading slashes kept.

use std::ffi::OsString;
use std::path::{Component, Path};

/// `str(pathlib.PurePosixPath(p))` of `p`, as an `OsString`.
pub fn python_path(p: &Path) -> OsString {
    let bytes = p.as_os_str().as_encoded_bytes();
    let mut out = OsString::with_capacity(bytes.len());
    let two_slashes = bytes.starts_with(b"//") && !bytes.starts_with(b"///");
    let mut first = true;
    for c in p.components() {
        match c {
            Component::RootDir => {
                out.push(if two_slashes { "//" } else { "/" });
                continue;
            }
            Component::CurDir => continue,
            Component::Prefix(prefix) => out.push(prefix.as_os_str()),
            Component::ParentDir => {
                if !first && !out.as_encoded_bytes().ends_with(b"/") {
                    out.push("/");
                }
                out.push("..");
            }
            Component::Normal(name) => {
                if !first && !out.as_encoded_bytes().ends_with(b"/") {
                    out.push("/");
                }
                out.push(name);
            }
        }
        first = false;
    }
    if out.is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_pathlib() {
        // Expected values printed by str(pathlib.Path(p)) on CPython 3.11.
        for (given, want) in [
            ("a/b", "a/b"),
            ("./a//b/./c/", "a/b/c"),
            ("/a/b", "/a/b"),
            ("//a/b", "//a/b"),
            ("///a", "/a"),
            (".", "."),
            ("", "."),
            ("../x/../y", "../x/../y"),
            ("/", "/"),
        ] {
            assert_eq!(
                python_path(Path::new(given)),
                OsString::from(want),
                "{given}"
            );
        }
    }
}
