//! Paths as Python shows them: `str(pathlib.Path(p))` and `.name`, the one
//! place a path becomes text for a record, a message or evidence.
//!
//! Records name stores and versions by the text Python's `pathlib` makes of
//! the discovered path, so a record reads the same whether Python or Rust
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

/// [`python_path`] as a `String` (bytes that are not UTF-8 replaced), for
/// messages and evidence.
pub fn display(p: &Path) -> String {
    python_path(p).to_string_lossy().into_owned()
}

/// `pathlib.Path(p).name`: the last name, `""` for a bare root or `.`.
pub fn last_name(p: &Path) -> String {
    match p.components().next_back() {
        Some(Component::Normal(name)) => name.to_string_lossy().into_owned(),
        Some(Component::ParentDir) => "..".to_string(),
        _ => String::new(),
    }
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

    #[test]
    fn display_and_last_name_match_pathlib() {
        // str(pathlib.Path(p)) and pathlib.Path(p).name on CPython 3.11.
        for (raw, text, name) in [
            ("", ".", ""),
            ("/", "/", ""),
            ("//a", "//a", "a"),
            ("///a//b/", "/a/b", "b"),
            ("./a/./b/.", "a/b", "b"),
            ("a/..", "a/..", ".."),
            ("/store/v0001/", "/store/v0001", "v0001"),
        ] {
            assert_eq!(display(Path::new(raw)), text, "{raw}");
            assert_eq!(last_name(Path::new(raw)), name, "{raw}");
        }
    }
}
