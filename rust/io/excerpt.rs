//! The one way a message quotes what a file holds.
//!
//! Messages end up in JSON, CSV, terminal tables, PR comments and HTML
//! reports, often read by someone other than whoever wrote the store, so a
//! message never carries more of a file than a short excerpt, and only
//! printable ASCII: every other character is written as a visible escape
//! (`\x1b`, `\n`, `\u{e9}`), a backslash as `\\`, and the excerpt is cut at
//! `MAX_EXCERPT` characters of input (then marked `...`). Python messages
//! use the same function (`adapterprobe._core.excerpt`).

/// Characters of a file's content a message quotes at most.
pub const MAX_EXCERPT: usize = 80;

/// `text` as a short printable-ASCII excerpt (see the module doc).
pub fn excerpt(text: &str) -> String {
    let mut out = String::with_capacity(MAX_EXCERPT + 8);
    for (n, c) in text.chars().enumerate() {
        if n == MAX_EXCERPT {
            out.push_str("...");
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    out
}

/// `bytes` (any encoding) as an excerpt: invalid UTF-8 shows as U+FFFD.
pub fn excerpt_bytes(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(MAX_EXCERPT * 4 + 4)];
    excerpt(&String::from_utf8_lossy(head))
}

/// Names from a file (column names, tags) for a message: the first
/// `MAX_LISTED`, each an excerpt, then how many there are in all.
pub const MAX_LISTED: usize = 12;

pub fn listed<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut shown = Vec::with_capacity(MAX_LISTED);
    let mut total = 0usize;
    for name in names {
        if total < MAX_LISTED {
            shown.push(excerpt(name));
        }
        total += 1;
    }
    if total > MAX_LISTED {
        shown.push(format!("... ({total} in all)"));
    }
    shown.join(", ")
}

/// `text` as an excerpt in double quotes, for "holds \"...\"" messages.
pub fn quoted(text: &str) -> String {
    format!("\"{}\"", excerpt(text).replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_printable_ascii_and_capped() {
        assert_eq!(excerpt("loss"), "loss");
        assert_eq!(excerpt("a\x1b[2Jb\n\u{7}"), "a\\x1b[2Jb\\n\\x07");
        assert_eq!(excerpt("caf\u{e9} \\"), "caf\\u{e9} \\\\");
        let long = "x".repeat(500);
        assert_eq!(excerpt(&long), format!("{}...", "x".repeat(MAX_EXCERPT)));
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        assert_eq!(excerpt_bytes(b"ok\xff"), "ok\\u{fffd}");
        let many: Vec<String> = (0..20).map(|i| format!("c{i}")).collect();
        let text = listed(many.iter().map(String::as_str));
        assert!(
            text.starts_with("c0, c1") && text.ends_with("c11, ... (20 in all)"),
            "{text}"
        );
        for s in ["\u{202e}evil", "\u{0}", "<script>", "\u{9b}31m"] {
            let e = excerpt(s);
            assert!(e.bytes().all(|b| (b' '..=b'~').contains(&b)), "{e}");
        }
    }
}
