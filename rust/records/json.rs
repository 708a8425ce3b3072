//! A record's JSON object, byte for byte as `ScanRecord.to_json` writes it
//! (`json.dumps` defaults, non-finite numbers as `null`).

use std::ffi::OsStr;
use std::fmt::Write;

use crate::io::json_text;
use crate::records::Record;
use crate::verdicts::evidence::push_float;

/// Append a path as Python's `json.dumps(os.fsdecode(path))` writes it:
/// bytes that are not UTF-8 were decoded to lone surrogates
/// (`surrogateescape`), which `json.dumps` writes as `\udcXX`.
pub fn push_os_str(out: &mut String, text: &OsStr) {
    out.push('"');
    for chunk in text.as_encoded_bytes().utf8_chunks() {
        json_text::push_str_body(out, chunk.valid());
        for b in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\udc{b:02x}");
        }
    }
    out.push('"');
}

fn push_opt_str(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => json_text::push_str(out, s),
        None => out.push_str("null"),
    }
}

/// The record's JSON object.
pub fn record_json(r: &Record) -> String {
    let j = &r.judged;
    let mut out = String::with_capacity(512);
    out.push_str("{\"store\": ");
    push_os_str(&mut out, &r.store);
    out.push_str(", \"adapter\": ");
    match &r.adapter {
        Some(a) => push_os_str(&mut out, a),
        None => out.push_str("null"),
    }
    out.push_str(", \"layout\": ");
    json_text::push_str(&mut out, &r.layout);
    out.push_str(", \"probe\": ");
    json_text::push_str(&mut out, j.kind);
    out.push_str(", \"verdict\": ");
    json_text::push_str(&mut out, j.verdict.as_str());
    out.push_str(", \"score\": ");
    match j.score {
        Some(x) => push_float(&mut out, x),
        None => out.push_str("null"),
    }
    out.push_str(", \"message\": ");
    json_text::push_str(&mut out, &j.message);
    out.push_str(", \"evidence\": ");
    j.evidence.write_json(&mut out);
    out.push_str(", \"checkpoint_kind\": ");
    push_opt_str(&mut out, r.checkpoint_kind.as_deref());
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn non_utf8_paths_are_surrogate_escapes() {
        let mut out = String::new();
        push_os_str(&mut out, OsStr::from_bytes(b"caf\xe9/\"x\"\xff\xfe"));
        // json.dumps(os.fsdecode(b'caf\xe9/"x"\xff\xfe'))
        assert_eq!(out, "\"caf\\udce9/\\\"x\\\"\\udcff\\udcfe\"");
        let mut plain = String::new();
        push_os_str(&mut plain, OsStr::new("a/é"));
        assert_eq!(plain, "\"a/\\u00e9\"");
    }
}
