//! Properties of the pickle reader.

use super::*;

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
