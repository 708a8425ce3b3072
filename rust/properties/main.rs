//! Property tests of the readers' public APIs against hostile input.
//!
//! Why here and not in the modules: these treat each reader as a black box
//! fed by `proptest` (arbitrary bytes, and near-valid inputs that get past
//! the first checks), and assert what must hold for any input: no panic,
//! caps respected, offsets in bounds, reads inside the file, agreement with
//! a reference where one exists. The mutation fuzzer in `tests/fuzz/` does
//! the same end to end through Python; these run in `cargo test` in a few
//! seconds.

// All of this file is test code; clippy.toml's allow-*-in-tests settings
// cover only `#[test]` functions, not the helpers and strategies around them.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use adapterprobe_core::formats::logs::json_line::{classify, LineKind};
use adapterprobe_core::formats::pickle::{
    op, resolve_global, unpickle, unpickle_with, unpickle_with_policy, Id, Limits, UnknownGlobals,
    Unpickled, Value,
};
use adapterprobe_core::formats::safetensors_header::{
    dtype_bits, parse_header, read_header, Header,
};
use adapterprobe_core::formats::tensor_data::SafetensorsData;
use adapterprobe_core::io::zip_archive::Archive;
use adapterprobe_core::Area;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use serde_json::Value as Json;

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Shrunk failures are printed with their seed; nothing is written to the tree.
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

fn write_temp(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(bytes).unwrap();
    path
}

// ---------------------------------------------------------------------------
// safetensors headers

/// What every accepted header must satisfy: offsets ordered and inside the
/// data section, each span exactly the bytes its dtype and shape need.
fn check_accepted(h: &Header, data_len: u64) {
    assert_eq!(h.data_len, data_len);
    let mut names = HashSet::new();
    for t in &h.tensors {
        assert!(
            names.insert(&t.name),
            "duplicate tensor {:?} accepted",
            t.name
        );
        let (begin, end) = t.data_offsets;
        assert!(begin <= end && end <= data_len, "{t:?} outside {data_len}");
        let bits = dtype_bits(&t.dtype).unwrap_or_else(|| panic!("dtype {:?}", t.dtype));
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap();
        assert_eq!(
            numel.checked_mul(bits).unwrap().div_ceil(8),
            end - begin,
            "{t:?}"
        );
    }
}

fn dtype() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec!["F32", "F16", "BF16", "F64", "U8", "I64", "BOOL", "F4", "F6_E2M3"]),
        1 => prop::sample::select(vec!["F128", "f32", "", "Q4", "F8"]),
    ]
    .prop_map(str::to_owned)
}

fn dim() -> impl Strategy<Value = Json> {
    prop_oneof![
        8 => (0u64..5).prop_map(Json::from),
        1 => prop::sample::select(vec![1u64 << 32, u64::MAX, 1 << 62]).prop_map(Json::from),
        1 => prop::sample::select(vec![Json::from(-1), Json::from(1.5), Json::from("2"), Json::Null]),
    ]
}

/// One tensor entry: (name, dtype, shape, offsets), offsets near the
/// contiguous layout or anywhere.
fn tensor_entry() -> impl Strategy<Value = (String, String, Vec<Json>, Json)> {
    let offsets = prop_oneof![
        4 => Just(Json::Null), // filled in contiguously below
        2 => (0u64..64, 0u64..64).prop_map(|(a, b)| Json::from(vec![a, b])),
        1 => prop::sample::select(vec![
            Json::from(vec![u64::MAX - 1, u64::MAX]),
            Json::from(vec![0u64]),
            Json::from(vec![0u64, 1, 2]),
            serde_json::json!([-1, 4]),
            serde_json::json!(["0", 4]),
            serde_json::json!({"a": 1}),
        ]),
    ];
    (
        prop::sample::select(vec!["a", "b", "c", "d", "__metadata__"]).prop_map(str::to_owned),
        dtype(),
        prop::collection::vec(dim(), 0..4),
        offsets,
    )
}

/// Header JSON (keys may repeat: written by hand, not through a map) and a data length.
fn near_valid_header() -> impl Strategy<Value = (String, u64)> {
    (
        prop::collection::vec(tensor_entry(), 0..6),
        0u64..4,
        any::<bool>(),
    )
        .prop_map(|(entries, slack, metadata)| {
            let mut at = 0u64;
            let mut members = vec![];
            if metadata {
                members.push(r#""__metadata__": {"format": "pt"}"#.to_string());
            }
            for (name, dtype, shape, offsets) in entries {
                let offsets = if offsets.is_null() {
                    let numel = shape
                        .iter()
                        .try_fold(1u64, |a, d| a.checked_mul(d.as_u64()?));
                    let bytes = numel
                        .and_then(|n| n.checked_mul(dtype_bits(&dtype).unwrap_or(8)))
                        .map_or(8, |b| b.div_ceil(8));
                    let end = at.saturating_add(bytes);
                    let pair = Json::from(vec![at, end]);
                    at = end;
                    pair
                } else {
                    offsets
                };
                let entry =
                    serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": offsets});
                members.push(format!("{}: {entry}", Json::from(name)));
            }
            (
                format!("{{{}}}", members.join(", ")),
                at.saturating_add(slack),
            )
        })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn header_parser_never_panics_on_bytes(json in prop::collection::vec(any::<u8>(), 0..256), data_len: u64) {
        if let Ok(h) = parse_header(&json, data_len) {
            check_accepted(&h, data_len);
        }
    }

    #[test]
    fn accepted_near_valid_headers_are_in_bounds((json, data_len) in near_valid_header()) {
        if let Ok(h) = parse_header(json.as_bytes(), data_len) {
            check_accepted(&h, data_len);
        }
    }
}

proptest! {
    #![proptest_config(config(160))]

    /// Through a real file: the length prefix is checked against the file, and
    /// an opened file's tensors (the weights reader's view) never overlap.
    #[test]
    fn opened_files_have_in_bounds_disjoint_tensors(
        (json, data_len) in near_valid_header(),
        length_edit in prop_oneof![4 => Just(None), 1 => any::<u64>().prop_map(Some)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = length_edit.unwrap_or(json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        // Shapes may claim exabytes; the file holds at most 64 KiB of data.
        bytes.resize(bytes.len() + data_len.min(1 << 16) as usize, 0);
        let path = write_temp(&dir, "x.safetensors", &bytes);
        if let Ok(h) = read_header(&path) {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            assert_eq!(8 + n + h.data_len, bytes.len() as u64);
            check_accepted(&h, h.data_len);
        }
        if let Ok(data) = SafetensorsData::open(&path) {
            let mut spans: Vec<(u64, u64)> = data
                .header()
                .tensors
                .iter()
                .map(|t| t.data_offsets)
                .filter(|(b, e)| e > b)
                .collect();
            spans.sort_unstable();
            for pair in spans.windows(2) {
                assert!(pair[0].1 <= pair[1].0, "overlapping tensors accepted: {spans:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// dlm JSON lines

/// A small serde_json-based reference for what `classify` decides on a line
/// serde accepts: a top-level object whose last "type" is "step", with
/// "step" and "loss" converting as Python's int()/float() would.
fn reference(v: &Json) -> LineKind {
    let Json::Object(map) = v else {
        return LineKind::Other;
    };
    if map.get("type").and_then(Json::as_str) != Some("step") {
        return LineKind::Other;
    }
    let step = match map.get("step") {
        Some(Json::Bool(b)) => Some(i64::from(*b)),
        Some(Json::Number(n)) if n.is_f64() => n.as_f64().and_then(|x| {
            let t = x.trunc();
            ((-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&t))
                .then_some(t as i64)
        }),
        Some(Json::Number(n)) => n.as_i64(),
        Some(Json::String(s)) => python_int(s),
        _ => None,
    };
    let loss = match map.get("loss") {
        Some(Json::Bool(b)) => Some(f64::from(u8::from(*b))),
        Some(Json::Number(n)) => n.as_f64(),
        Some(Json::String(s)) => python_float(s),
        _ => None,
    };
    match (step, loss) {
        (Some(s), Some(l)) => LineKind::Step(s, l),
        _ => LineKind::Other,
    }
}

/// Python's int() of the ASCII strings the generator writes.
fn python_int(s: &str) -> Option<i64> {
    let t = s.trim().replace('_', "");
    if t.is_empty() || s.trim().starts_with('_') || s.trim().ends_with('_') || s.contains("__") {
        return None;
    }
    t.parse::<i64>()
        .ok()
        .filter(|_| !t.starts_with('+') || t.len() > 1)
}

/// Python's float() of the ASCII strings the generator writes.
fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "nan" | "+nan" | "-nan" => return Some(f64::NAN),
        "inf" | "+inf" | "infinity" | "+infinity" => return Some(f64::INFINITY),
        "-inf" | "-infinity" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    if t.contains("__") || t.starts_with('_') || t.ends_with('_') || t.contains("._") {
        return None;
    }
    t.replace('_', "").parse::<f64>().ok()
}

fn same_kind(a: LineKind, b: LineKind) -> bool {
    match (a, b) {
        (LineKind::Step(s1, l1), LineKind::Step(s2, l2)) => {
            s1 == s2 && (l1 == l2 || (l1.is_nan() && l2.is_nan()))
        }
        _ => a == b,
    }
}

/// JSON numbers that both parsers read exactly (so no rounding differences).
fn exact_number() -> impl Strategy<Value = Json> {
    prop_oneof![
        any::<i64>().prop_map(Json::from),
        any::<u64>().prop_map(Json::from),
        (-1_000_000i32..1_000_000, 0u32..12)
            .prop_map(|(m, k)| Json::from(f64::from(m) / f64::from(1u32 << k))),
        prop::sample::select(vec![
            1e300,
            -1e300,
            1e-300,
            -0.0,
            0.5,
            9.007_199_254_740_992e15
        ])
        .prop_map(Json::from),
    ]
}

fn leaf() -> impl Strategy<Value = Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        exact_number(),
        prop::sample::select(vec![
            "step", "12", " 7 ", "1_0", "_1", "1__0", "1.5", "-2.25e1", "nan", "-inf", "Infinity",
            "abc", "", "+3", "0x10", "1e400", "é", "\u{2028}", "\"", "\\",
        ])
        .prop_map(|s| Json::from(s.to_owned())),
    ]
}

fn value() -> impl Strategy<Value = Json> {
    leaf().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            prop::collection::vec(("[a-z]{0,3}", inner), 0..4)
                .prop_map(|kv| Json::Object(kv.into_iter().collect())),
        ]
    })
}

/// Key texts as they appear on the line, escapes included.
fn key_text() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        r#""type""#,
        r#""step""#,
        r#""loss""#,
        r#""typ\u0065""#,
        r#""\u0073tep""#,
        r#""lo\u0073s""#,
        r#""Type""#,
        r#""type ""#,
        r#""x""#,
        r#""""#,
    ])
    .prop_map(str::to_owned)
}

fn ws() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", " ", "\t", "\r", "  "])
}

/// A JSON object as text, members in order and duplicates kept: usually a
/// step record (type, step and loss, keys sometimes escaped) among other
/// members that may repeat or override those keys.
fn object_line() -> impl Strategy<Value = String> {
    let member =
        (key_text(), value(), ws(), ws()).prop_map(|(k, v, a, b)| format!("{a}{k}{b}:{a}{v}{b}"));
    let scalar = prop_oneof![4 => exact_number(), 3 => leaf()];
    let field = move |keys: Vec<&'static str>| {
        prop_oneof![
            6 => (prop::sample::select(keys), scalar.clone()).prop_map(|(k, v)| format!("{k}: {v}")),
            1 => Just(String::new()),
        ]
    };
    let typed = prop_oneof![
        6 => prop::sample::select(vec![r#""type": "step""#, r#""typ\u0065": "st\u0065p""#]),
        1 => Just(r#""type": "banner""#),
        1 => Just(""),
    ]
    .prop_map(str::to_owned);
    let step = field(vec![r#""step""#, r#""\u0073tep""#]);
    let loss = field(vec![r#""loss""#, r#""lo\u0073s""#]);
    (
        [typed.boxed(), step.boxed(), loss.boxed()],
        prop::collection::vec(member, 0..3),
        prop::collection::vec(any::<prop::sample::Index>(), 3),
    )
        .prop_map(|(fields, mut parts, at)| {
            for (f, i) in fields.into_iter().zip(at) {
                if !f.is_empty() {
                    parts.insert(i.index(parts.len() + 1), f);
                }
            }
            format!("{{{}}}", parts.join(","))
        })
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn classifier_never_panics_on_bytes(line in prop::collection::vec(any::<u8>(), 0..200)) {
        classify(&line);
    }

    #[test]
    fn classifier_never_panics_on_json_like_text(
        line in r#"[\[\]{}":,0-9eE.+\- tnrufalsNIiy\\u"]{0,80}"#
    ) {
        if serde_json::from_str::<Json>(&line).is_ok() {
            prop_assert_ne!(classify(line.as_bytes()), LineKind::Invalid, "{}", line);
        }
    }

    /// Where serde_json accepts the line, the classifier agrees with the reference.
    #[test]
    fn classifier_agrees_with_serde_reference(line in object_line()) {
        let parsed: Result<Json, _> = serde_json::from_str(&line);
        prop_assume!(parsed.is_ok());
        let expected = reference(&parsed.unwrap());
        let got = classify(line.as_bytes());
        prop_assert!(same_kind(got, expected), "{line}: got {got:?}, reference {expected:?}");
    }

    /// Python's dialect: NaN and the infinities are losses, though serde refuses them.
    #[test]
    fn classifier_accepts_python_nan_and_infinity(
        step in any::<i64>(),
        token in prop::sample::select(vec!["NaN", "Infinity", "-Infinity"]),
        extra in value(),
    ) {
        let line = format!(r#"{{"x": {extra}, "loss": {token}, "type": "step", "step": {step}}}"#);
        prop_assert!(serde_json::from_str::<Json>(&line).is_err());
        let expected = match token {
            "NaN" => f64::NAN,
            "Infinity" => f64::INFINITY,
            _ => f64::NEG_INFINITY,
        };
        prop_assert!(same_kind(classify(line.as_bytes()), LineKind::Step(step, expected)));
    }
}

// ---------------------------------------------------------------------------
// pickle

fn small_limits() -> impl Strategy<Value = Limits> {
    (
        4usize..64,
        1usize..8,
        1usize..16,
        4usize..128,
        0usize..16,
        0usize..256,
        0usize..4,
    )
        .prop_map(
            |(stack, marks, memo, values, container, strings, dims)| Limits {
                max_pickle_bytes: 4096,
                max_stack: stack,
                max_marks: marks,
                max_memo: memo,
                max_values: values,
                max_container_len: container,
                max_string_bytes: strings,
                max_tensor_dims: dims,
            },
        )
}

/// One opcode with plausible (sometimes hostile) argument bytes.
fn opcode() -> impl Strategy<Value = Vec<u8>> {
    let push = prop::sample::select(vec![
        op::MARK,
        op::DUP,
        op::NONE,
        op::NEWTRUE,
        op::NEWFALSE,
        op::EMPTY_TUPLE,
        op::EMPTY_LIST,
        op::EMPTY_DICT,
        op::EMPTY_SET,
        op::MEMOIZE,
    ])
    .prop_map(|b| vec![b]);
    let consume = prop::sample::select(vec![
        op::POP,
        op::POP_MARK,
        op::TUPLE,
        op::TUPLE1,
        op::TUPLE2,
        op::TUPLE3,
        op::LIST,
        op::APPEND,
        op::APPENDS,
        op::DICT,
        op::SETITEM,
        op::SETITEMS,
        op::ADDITEMS,
        op::FROZENSET,
        op::STACK_GLOBAL,
        op::OBJ,
        op::NEWOBJ,
        op::NEWOBJ_EX,
        op::REDUCE,
        op::BUILD,
        op::BINPERSID,
        op::STOP,
        op::NEXT_BUFFER,
        op::READONLY_BUFFER,
    ])
    .prop_map(|b| vec![b]);
    let one_byte = (
        prop::sample::select(vec![
            op::BININT1,
            op::BINGET,
            op::BINPUT,
            op::PROTO,
            op::EXT1,
        ]),
        any::<u8>(),
    )
        .prop_map(|(o, a)| vec![o, a]);
    let four_bytes = (
        prop::sample::select(vec![op::BININT, op::LONG_BINGET, op::LONG_BINPUT, op::EXT4]),
        prop_oneof![0u32..8, Just(u32::MAX), any::<u32>()],
    )
        .prop_map(|(o, a)| {
            let mut v = vec![o];
            v.extend_from_slice(&a.to_le_bytes());
            v
        });
    let strings = (
        prop::sample::select(vec![
            op::SHORT_BINUNICODE,
            op::BINUNICODE,
            op::SHORT_BINBYTES,
            op::BINBYTES,
            op::SHORT_BINSTRING,
            op::BINSTRING,
            op::BINUNICODE8,
            op::BINBYTES8,
            op::BYTEARRAY8,
        ]),
        prop::sample::select(vec![
            "storage",
            "a",
            "",
            "torch",
            "FloatStorage",
            "0",
            "cpu",
            "latin1",
        ]),
        prop_oneof![6 => Just(None), 1 => any::<u64>().prop_map(Some)],
    )
        .prop_map(|(o, s, claimed)| {
            let len = claimed.unwrap_or(s.len() as u64);
            let mut v = vec![o];
            match o {
                op::SHORT_BINUNICODE | op::SHORT_BINBYTES | op::SHORT_BINSTRING => {
                    v.push(len as u8)
                }
                op::BINUNICODE8 | op::BINBYTES8 | op::BYTEARRAY8 => {
                    v.extend_from_slice(&len.to_le_bytes())
                }
                _ => v.extend_from_slice(&(len as u32).to_le_bytes()),
            }
            v.extend_from_slice(s.as_bytes());
            v
        });
    let long = (prop::collection::vec(any::<u8>(), 0..12), any::<bool>()).prop_map(|(b, four)| {
        let mut v = if four {
            let mut v = vec![op::LONG4];
            v.extend_from_slice(&(b.len() as u32).to_le_bytes());
            v
        } else {
            vec![op::LONG1, b.len() as u8]
        };
        v.extend(b);
        v
    });
    let text = (
        prop::sample::select(vec![
            op::INT,
            op::LONG,
            op::FLOAT,
            op::STRING,
            op::UNICODE,
            op::GET,
            op::PUT,
            op::PERSID,
        ]),
        prop::sample::select(vec![
            "0",
            "01",
            "-5",
            "99999999999999999999",
            "1.5",
            "'x'",
            "abc",
            "",
            "nan",
        ]),
    )
        .prop_map(|(o, t)| {
            let mut v = vec![o];
            v.extend_from_slice(t.as_bytes());
            v.push(b'\n');
            v
        });
    let globals = prop::sample::select(vec![
        &b"ctorch._utils\n_rebuild_tensor_v2\n"[..],
        b"ctorch\nFloatStorage\n",
        b"ctorch\nfloat32\n",
        b"ccollections\nOrderedDict\n",
        b"c_codecs\nencode\n",
        b"ctorch.storage\nUntypedStorage\n",
        b"cos\nsystem\n",
        b"cbuiltins\neval\n",
        b"G\x3f\xf8\x00\x00\x00\x00\x00\x00",
        b"\x95\x08\x00\x00\x00\x00\x00\x00\x00",
    ])
    .prop_map(<[u8]>::to_vec);
    prop_oneof![
        5 => push,
        4 => consume,
        3 => one_byte,
        2 => four_bytes,
        4 => strings,
        1 => long,
        1 => text,
        2 => globals,
    ]
}

/// Drop the opcodes that would certainly underflow the stack or find no MARK
/// (a rough model of each opcode's stack effect), so that most streams get
/// deep into the interpreter instead of failing at their first few bytes.
fn keep_stack_valid(ops: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out = vec![op::PROTO, 2];
    let (mut depth, mut marks) = (0usize, Vec::<usize>::new());
    for o in ops {
        let floor = marks.last().copied().unwrap_or(0);
        let above = depth - floor;
        let code = o[0];
        let (ok, new_depth) = match code {
            op::MARK => (true, depth),
            op::DUP => (above >= 1, depth + 1),
            op::POP => (
                above >= 1 || !marks.is_empty(),
                if above >= 1 { depth - 1 } else { floor },
            ),
            op::POP_MARK => (!marks.is_empty(), floor),
            op::TUPLE | op::LIST | op::DICT | op::FROZENSET | op::OBJ => (
                !marks.is_empty() && (code != op::OBJ || above >= 1),
                floor + 1,
            ),
            op::APPENDS | op::SETITEMS | op::ADDITEMS => {
                let below = marks.len().checked_sub(2).map_or(0, |i| marks[i]);
                (!marks.is_empty() && floor > below, floor)
            }
            op::TUPLE1 => (above >= 1, depth),
            op::TUPLE2 | op::APPEND | op::STACK_GLOBAL | op::REDUCE | op::BUILD | op::NEWOBJ => {
                (above >= 2, depth.saturating_sub(1))
            }
            op::TUPLE3 | op::SETITEM | op::NEWOBJ_EX => (above >= 3, depth.saturating_sub(2)),
            op::BINPERSID | op::BINPUT | op::LONG_BINPUT | op::PUT | op::MEMOIZE => {
                (above >= 1, depth)
            }
            op::READONLY_BUFFER => (above >= 1, depth),
            op::STOP | op::PROTO | op::FRAME => (false, depth),
            _ => (true, depth + 1),
        };
        if !ok {
            continue;
        }
        match code {
            op::MARK => marks.push(depth),
            op::POP if above == 0 => {
                marks.pop();
            }
            op::POP_MARK
            | op::TUPLE
            | op::LIST
            | op::DICT
            | op::FROZENSET
            | op::OBJ
            | op::APPENDS
            | op::SETITEMS
            | op::ADDITEMS => {
                marks.pop();
            }
            _ => {}
        }
        depth = new_depth;
        out.extend(o);
    }
    if depth == marks.last().copied().unwrap_or(0) {
        out.push(op::NONE);
    }
    out.push(op::STOP);
    out
}

fn opcode_stream() -> impl Strategy<Value = Vec<u8>> {
    let ops = || prop::collection::vec(opcode(), 0..48);
    prop_oneof![
        1 => ops().prop_map(|ops| {
            let mut out = vec![op::PROTO, 2];
            out.extend(ops.into_iter().flatten());
            out.push(op::STOP);
            out
        }),
        3 => ops().prop_map(keep_stack_valid),
    ]
}

/// Walk every value reachable from the root and check it against `limits`.
fn check_caps(u: &Unpickled, limits: &Limits) {
    let mut seen = HashSet::new();
    let mut todo: Vec<Id> = vec![u.root];
    let mut string_bytes = 0usize;
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        match u.get(id) {
            Value::Tuple(items) | Value::List(items) | Value::Set(items) => {
                if !matches!(u.get(id), Value::Tuple(_)) || items.len() > 3 {
                    assert!(
                        items.len() <= limits.max_container_len,
                        "container of {}",
                        items.len()
                    );
                }
                todo.extend(items);
            }
            Value::Dict(entries) => {
                assert!(entries.len() <= limits.max_container_len);
                for &(k, v) in entries {
                    todo.push(k);
                    todo.push(v);
                }
            }
            Value::Str(s) => string_bytes += s.len(),
            Value::Bytes(b) => string_bytes += b.len(),
            Value::Tensor(t) => assert!(t.size.len() <= limits.max_tensor_dims),
            _ => {}
        }
    }
    assert!(
        seen.len() <= limits.max_values,
        "{} values reachable",
        seen.len()
    );
    assert!(
        string_bytes <= limits.max_string_bytes,
        "{string_bytes} string bytes"
    );
}

/// An identifier-like name that the allow-list does not cover together with `module`.
fn global_name() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof![
            Just("os".to_owned()),
            Just("torch".to_owned()),
            Just("torch._utils".to_owned()),
            Just("builtins".to_owned()),
            "[a-z_][a-z0-9_.]{0,20}",
        ],
        "[A-Za-z_][A-Za-z0-9_]{0,20}",
    )
        .prop_filter("allow-listed", |(m, n)| resolve_global(m, n).is_none())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn unpickler_never_panics_on_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = unpickle(&data);
        let _ = unpickle_with_policy(&data, Limits::default(), UnknownGlobals::Placeholder);
    }

    #[test]
    fn opcode_streams_never_panic_and_respect_the_caps(
        data in opcode_stream(),
        limits in small_limits(),
        placeholder: bool,
    ) {
        let policy = if placeholder { UnknownGlobals::Placeholder } else { UnknownGlobals::Refuse };
        if let Ok(u) = unpickle_with_policy(&data, limits, policy) {
            check_caps(&u, &limits);
        }
        if let Ok(u) = unpickle(&data) {
            check_caps(&u, &Limits::default());
        }
    }

    /// Bombs one past each cap are refused as malformed, whatever the cap.
    #[test]
    fn bombs_past_a_cap_are_refused(limits in small_limits(), which in 0usize..5) {
        let mut data = vec![op::PROTO, 2];
        match which {
            0 => data.extend(std::iter::repeat_n(op::MARK, limits.max_marks + 1)),
            1 => data.extend(std::iter::repeat_n(op::NONE, limits.max_stack + 1)),
            2 => data.extend(std::iter::repeat_n(op::EMPTY_LIST, limits.max_values)),
            3 => {
                data.push(op::NONE);
                for i in 0..=limits.max_memo {
                    data.push(op::LONG_BINPUT);
                    data.extend_from_slice(&(i as u32).to_le_bytes());
                }
            }
            _ => {
                data.push(op::BINBYTES);
                let n = limits.max_string_bytes + 1;
                data.extend_from_slice(&(n as u32).to_le_bytes());
                data.extend(std::iter::repeat_n(b'x', n));
            }
        }
        data.push(op::STOP);
        let e = unpickle_with(&data, limits).unwrap_err();
        prop_assert_eq!(e.area, Area::TrainingState, "{}", e);
    }

    /// A global outside the allow-list is refused, by name, before anything else
    /// happens to it; the placeholder policy stands an opaque value in for it.
    #[test]
    fn unlisted_globals_are_refused(
        (module, name) in global_name(),
        stack_global: bool,
        call: bool,
        prefix in prop::collection::vec(prop::sample::select(vec![op::NONE, op::EMPTY_DICT, op::MARK]), 0..4),
    ) {
        let mut data = vec![op::PROTO, 4];
        data.extend(&prefix);
        if stack_global {
            for s in [&module, &name] {
                data.push(op::SHORT_BINUNICODE);
                data.push(s.len() as u8);
                data.extend_from_slice(s.as_bytes());
            }
            data.push(op::STACK_GLOBAL);
        } else {
            data.push(op::GLOBAL);
            data.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
        }
        if call {
            data.extend_from_slice(b"X\x0b\x00\x00\x00touch PWNED\x85R");
        }
        data.push(op::STOP);
        let e = unpickle(&data).unwrap_err();
        prop_assert_eq!(e.area, Area::UnsafePickle);
        prop_assert_eq!(e.global, Some(format!("{module}.{name}")));
        if prefix.is_empty() {
            let u = unpickle_with_policy(&data, Limits::default(), UnknownGlobals::Placeholder).unwrap();
            prop_assert!(matches!(u.get(u.root), Value::Opaque(_)));
        }
    }
}

// ---------------------------------------------------------------------------
// zip archives

/// A valid STORED zip of `entries` (what torch.save writes, minus alignment padding).
fn zip_bytes(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![];
    let mut central = vec![];
    for (name, data) in entries {
        let offset = out.len() as u32;
        let size = data.len() as u32;
        out.extend_from_slice(b"PK\x03\x04");
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&0u32.to_le_bytes()); // crc, not checked by the reader
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(b"PK\x01\x02");
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 8]); // extra, comment, disk, attributes
        central.extend_from_slice(&0u32.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    let n = entries.len() as u16;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn entries() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    prop::collection::vec(
        (
            "archive/[a-z]{1,6}",
            prop::collection::vec(any::<u8>(), 0..64),
        ),
        1..5,
    )
}

/// An edit of a zip: overwrite bytes at a position with a boundary value, or truncate.
#[derive(Debug, Clone)]
enum ZipEdit {
    Put {
        at: prop::sample::Index,
        value: u32,
        width: u8,
    },
    Truncate(prop::sample::Index),
    Append(Vec<u8>),
}

fn zip_edit() -> impl Strategy<Value = ZipEdit> {
    prop_oneof![
        6 => (
            any::<prop::sample::Index>(),
            prop_oneof![Just(0u32), Just(u32::MAX), Just(0xffff), Just(1 << 31), any::<u32>()],
            prop::sample::select(vec![1u8, 2, 4]),
        )
            .prop_map(|(at, value, width)| ZipEdit::Put { at, value, width }),
        1 => any::<prop::sample::Index>().prop_map(ZipEdit::Truncate),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(ZipEdit::Append),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[ZipEdit]) -> Vec<u8> {
    for e in edits {
        match e {
            ZipEdit::Put { at, value, width } if !data.is_empty() => {
                let i = at.index(data.len());
                let bytes = value.to_le_bytes();
                for (k, b) in bytes.iter().take(usize::from(*width)).enumerate() {
                    if let Some(slot) = data.get_mut(i + k) {
                        *slot = *b;
                    }
                }
            }
            ZipEdit::Truncate(at) => {
                let n = at.index(data.len() + 1);
                data.truncate(n);
            }
            ZipEdit::Append(tail) => data.extend_from_slice(tail),
            _ => {}
        }
    }
    data
}

/// Open the archive and read every entry whole and in parts; every byte read
/// must be a run of the file's own bytes.
fn check_archive(path: &Path, file: &[u8]) {
    let Ok(archive) = Archive::open(path) else {
        return;
    };
    assert_eq!(archive.len, file.len() as u64);
    let mut buf = vec![];
    for (name, entry) in &archive.entries {
        assert!(
            entry.size <= archive.len,
            "{name} claims {} bytes",
            entry.size
        );
        for (skip, len) in [
            (0, entry.size),
            (1, entry.size.saturating_sub(2)),
            (entry.size, 1),
        ] {
            match archive.read_entry_range(name, entry, skip, len, &mut buf) {
                Ok(()) => {
                    assert_eq!(buf.len() as u64, len);
                    assert!(
                        buf.is_empty() || file.windows(buf.len()).any(|w| w == buf.as_slice()),
                        "{name}: read bytes that are not in the file"
                    );
                }
                Err(e) => assert_eq!(e.area, Area::TrainingState),
            }
        }
        assert!(archive
            .read_entry_range(name, entry, u64::MAX, 2, &mut buf)
            .is_err());
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn zip_reader_never_panics_on_bytes(data in prop::collection::vec(any::<u8>(), 0..300)) {
        let dir = tempfile::tempdir().unwrap();
        let path = write_temp(&dir, "a.pt", &data);
        check_archive(&path, &data);
    }

    #[test]
    fn valid_archives_read_back_exactly(entries in entries()) {
        let dir = tempfile::tempdir().unwrap();
        let data = zip_bytes(&entries);
        let path = write_temp(&dir, "a.pt", &data);
        let archive = Archive::open(&path).unwrap();
        let mut buf = vec![];
        // A repeated name resolves to one of its entries; unique names read back exactly.
        for (name, body) in &entries {
            let e = archive.entry(name).unwrap();
            archive.read_entry_range(name, e, 0, e.size, &mut buf).unwrap();
            if entries.iter().filter(|(n, _)| n == name).count() == 1 {
                prop_assert_eq!(&buf, body);
            }
        }
    }

    #[test]
    fn mutated_archives_never_panic_or_read_outside_the_file(
        entries in entries(),
        edits in prop::collection::vec(zip_edit(), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = apply(zip_bytes(&entries), &edits);
        let path = write_temp(&dir, "a.pt", &data);
        check_archive(&path, &data);
    }
}
