//! Properties of the dlm JSON lines reader.

use super::*;

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
