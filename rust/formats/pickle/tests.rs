//! Unit tests of the pickle interpreter.

use super::machine::decode_long;
use super::*;

fn run(bytes: &[u8]) -> PResult<Unpickled> {
    unpickle(bytes)
}

#[test]
fn dict_of_scalars() {
    // {'a': 1, 'b': 2.5, 'c': None, 'd': True} at protocol 2
    let mut p = vec![0x80, 2, b'}', b'q', 0, b'('];
    p.extend_from_slice(b"X\x01\x00\x00\x00aK\x01");
    p.extend_from_slice(b"X\x01\x00\x00\x00bG");
    p.extend_from_slice(&2.5f64.to_be_bytes());
    p.extend_from_slice(b"X\x01\x00\x00\x00cN");
    p.extend_from_slice(b"X\x01\x00\x00\x00d\x88u.");
    let u = run(&p).unwrap();
    let get = |k| u.get(u.dict_get(u.root, k).unwrap()).clone();
    assert_eq!(get("a"), Value::Int(1));
    assert_eq!(get("b"), Value::Float(2.5));
    assert_eq!(get("c"), Value::None);
    assert_eq!(get("d"), Value::Bool(true));
    assert_eq!(u.dict_str_keys(u.root), ["a", "b", "c", "d"]);
}

#[test]
fn later_duplicate_key_wins() {
    let p = b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00aK\x02u.";
    let u = run(p).unwrap();
    assert_eq!(u.get(u.dict_get(u.root, "a").unwrap()), &Value::Int(2));
    assert_eq!(u.dict_str_keys(u.root), ["a"]);
}

#[test]
fn long1_signs() {
    assert_eq!(decode_long(&[0xff]), Value::Int(-1));
    assert_eq!(decode_long(&[0x00, 0x01]), Value::Int(256));
    assert_eq!(decode_long(&[0xff, 0x00]), Value::Int(255));
    assert_eq!(decode_long(&[0; 9]), Value::BigInt);
}

#[test]
fn disallowed_global_is_named() {
    let p = b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R.";
    let e = run(p).unwrap_err();
    assert_eq!(e.area, Area::UnsafePickle);
    assert!(e.message.contains("posix.system"), "{e}");
    let p = b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.";
    let e = run(p).unwrap_err();
    assert_eq!(e.area, Area::UnsafePickle);
    assert!(e.message.contains("builtins.eval"), "{e}");
    let p = b"(cos\nsystem\nS'x'\ni.";
    assert_eq!(run(p).unwrap_err().area, Area::UnsafePickle);
}

#[test]
fn unknown_opcode_is_named() {
    let e = run(b"\x80\x02\xff.").unwrap_err();
    assert!(e.message.contains("0xff"), "{e}");
    assert_eq!(e.offset, 2);
}

#[test]
fn truncated_inputs_error() {
    let full = b"\x80\x02X\x05\x00\x00\x00hello.";
    for n in 0..full.len() {
        assert!(run(&full[..n]).is_err(), "prefix {n}");
    }
    // A length prefix far beyond the data must not allocate.
    assert!(run(b"\x80\x02X\xff\xff\xff\xff.").is_err());
    assert!(run(b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff.").is_err());
}

#[test]
fn cyclic_list_is_fine() {
    // l = []; l.append(l)
    let u = run(b"\x80\x02]q\x00h\x00a.").unwrap();
    assert_eq!(u.get(u.root), &Value::List(vec![u.root]));
}

#[test]
fn memo_dense_and_sparse_indices() {
    let mut memo = Memo::default();
    memo.insert(0, 10);
    memo.insert(1_000_000, 11); // far past the end: sparse
    memo.insert(5, 12); // within the slack: dense
    memo.insert(5, 13); // overwrite does not count twice
    assert_eq!(memo.len(), 3);
    assert!(memo.dense.len() < 100);
    for i in 6..2000u32 {
        memo.insert(i, i); // grow the vector past nothing sparse yet
    }
    assert_eq!(
        (memo.get(0), memo.get(5), memo.get(1_000_000)),
        (Some(10), Some(13), Some(11))
    );
    assert_eq!(memo.get(3), None);
    // a sparse index the vector later grows over is still found
    let mut memo = Memo::default();
    memo.insert(100, 1);
    for i in 0..200u32 {
        if i != 100 {
            memo.insert(i, i + 1000);
        }
    }
    assert_eq!(memo.get(100), Some(1));
    memo.insert(100, 2);
    assert_eq!((memo.get(100), memo.len()), (Some(2), 200));
}

#[test]
fn memo_errors() {
    assert!(run(b"\x80\x02h\x05.").is_err());
    assert!(run(b"\x80\x02q\x00.").is_err());
    // huge memo index is fine as a hash key
    let u = run(b"\x80\x02Nr\xff\xff\xff\xffj\xff\xff\xff\xff.").unwrap();
    assert_eq!(u.get(u.root), &Value::None);
}

#[test]
fn limits_hold() {
    let limits = Limits {
        max_marks: 8,
        ..Limits::default()
    };
    let p = [b'('; 9];
    assert!(unpickle_with(&p, limits)
        .unwrap_err()
        .message
        .contains("MARK"));
    let limits = Limits {
        max_stack: 4,
        ..Limits::default()
    };
    assert!(unpickle_with(b"NNNNN.", limits)
        .unwrap_err()
        .message
        .contains("stack"));
    let limits = Limits {
        max_values: 5,
        ..Limits::default()
    };
    assert!(unpickle_with(b"K\x01K\x01K\x01.", limits).is_err());
    let limits = Limits {
        max_container_len: 2,
        ..Limits::default()
    };
    assert!(unpickle_with(b"]NaNaNa.", limits).is_err());
    let limits = Limits {
        max_string_bytes: 4,
        ..Limits::default()
    };
    assert!(unpickle_with(b"X\x05\x00\x00\x00hello.", limits).is_err());
    let limits = Limits {
        max_pickle_bytes: 3,
        ..Limits::default()
    };
    assert!(unpickle_with(b"NNN.", limits).is_err());
}

#[test]
fn stack_underflow_is_an_error() {
    for p in [
        &b"."[..],
        b"a.",
        b"s.",
        b"R.",
        b"t.",
        b"(\x85.",
        b"0.",
        b"2.",
        b"b.",
    ] {
        assert!(run(p).is_err(), "{p:?}");
    }
}

#[test]
fn tensor_rebuild() {
    // _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 6), 1, (2, 2), (3, 1), False, OrderedDict())
    let p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x01K\x02K\x02\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtR.";
    let u = run(p).unwrap();
    let Value::Tensor(t) = u.get(u.root) else {
        panic!("not a tensor: {:?}", u.get(u.root))
    };
    assert_eq!(t.dtype, DType::FLOAT32);
    assert_eq!(t.offset, 1);
    assert_eq!(t.size, [2, 2]);
    assert_eq!(t.stride, [3, 1]);
    assert_eq!(t.storage.numel, 6);
    assert_eq!(u.str_of(t.storage.key), Some("0"));
}

#[test]
fn calling_a_storage_class_is_refused() {
    let e = run(b"ctorch\nFloatStorage\n)R.").unwrap_err();
    assert_eq!(e.area, Area::TrainingState);
}

#[test]
fn codecs_encode_makes_bytes() {
    let u =
        run(b"c_codecs\nencode\nX\x03\x00\x00\x00\xc3\xbfaX\x06\x00\x00\x00latin1\x86R.").unwrap();
    assert_eq!(u.get(u.root), &Value::Bytes(vec![0xff, b'a']));
}

#[test]
fn protocol_zero_text_opcodes() {
    let u = run(b"(dp0\nS'k'\np1\nI42\nsS'f'\nF1.5\nsS'l'\nL7L\ns.").unwrap();
    assert_eq!(u.get(u.dict_get(u.root, "k").unwrap()), &Value::Int(42));
    assert_eq!(u.get(u.dict_get(u.root, "f").unwrap()), &Value::Float(1.5));
    assert_eq!(u.get(u.dict_get(u.root, "l").unwrap()), &Value::Int(7));
}

#[test]
fn never_panics_on_byte_soup() {
    // A cheap deterministic fuzz: every prefix and every single-byte
    // mutation of a valid tensor pickle must return, never panic.
    let base = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x01K\x02K\x02\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtR.";
    for_prefixes_and_byte_edits(base, 0x9e37_79b9_7f4a_7c15, |bytes| {
        let _ = run(bytes);
    });
}

/// Calls `check` on every prefix of `base` and on 16 single-byte
/// mutations per position (xorshift from `seed`): a cheap, deterministic
/// fuzz for "returns, never panics".
fn for_prefixes_and_byte_edits(base: &[u8], seed: u64, mut check: impl FnMut(&[u8])) {
    let mut state = seed;
    for i in 0..base.len() {
        check(&base[..i]);
        for _ in 0..16 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut m = base.to_vec();
            m[i] = (state >> 32) as u8;
            check(&m);
        }
    }
}

fn lenient(bytes: &[u8]) -> PResult<Unpickled> {
    unpickle_with_policy(bytes, Limits::default(), UnknownGlobals::Placeholder)
}

fn opaque(u: &Unpickled) -> Option<&str> {
    match u.get(u.root) {
        Value::Opaque(name) => Some(name),
        _ => None,
    }
}

#[test]
fn placeholders_stand_in_for_unknown_classes() {
    // Cfg() via NEWOBJ, given state by BUILD and items by SETITEMS.
    let p = b"\x80\x02c__main__\nCfg\n)\x81}X\x01\x00\x00\x00aK\x01sb(K\x01K\x02u.";
    assert_eq!(run(p).unwrap_err().area, Area::UnsafePickle);
    assert_eq!(opaque(&lenient(p).unwrap()), Some("__main__.Cfg"));
    // REDUCE on a placeholder, and protocol 0-1's copyreg reconstructor.
    let u = lenient(b"cfoo\nbar\nK\x01\x85R.").unwrap();
    assert_eq!(opaque(&u), Some("foo.bar"));
    let p = b"ccopyreg\n_reconstructor\n(c__main__\nCfg\ncbuiltins\nobject\nNtR.";
    assert_eq!(opaque(&lenient(p).unwrap()), Some("__main__.Cfg"));
    // STACK_GLOBAL, INST, OBJ, NEWOBJ_EX and EXT1.
    let u = lenient(b"\x80\x04\x8c\x03foo\x8c\x03Bar\x93.").unwrap();
    assert_eq!(opaque(&u), Some("foo.Bar"));
    assert_eq!(
        opaque(&lenient(b"(K\x01ifoo\nBar\n.").unwrap()),
        Some("foo.Bar")
    );
    assert_eq!(
        opaque(&lenient(b"(cfoo\nBar\nK\x01o.").unwrap()),
        Some("foo.Bar")
    );
    assert_eq!(
        opaque(&lenient(b"cfoo\nBar\n)}\x92.").unwrap()),
        Some("foo.Bar")
    );
    let u = lenient(b"\x82\x07.").unwrap();
    assert_eq!(opaque(&u), Some("copyreg._extension_registry.7"));
    assert_eq!(run(b"\x82\x07.").unwrap_err().area, Area::UnsafePickle);
    // An allowed callable fed a placeholder gives a placeholder.
    let p =
        b"ctorch._utils\n_rebuild_parameter\n(cfoo\nT\n)\x81\x89ccollections\nOrderedDict\n)RtR.";
    assert_eq!(opaque(&lenient(p).unwrap()), Some("foo.T"));
    // Instantiating an allowed class stays refused.
    assert!(lenient(b"ccollections\nOrderedDict\n)\x81.").is_err());
    assert!(lenient(b"(icollections\nOrderedDict\n.").is_err());
}

#[test]
fn build_state_on_a_modelled_value() {
    // OrderedDict() given `_metadata` by BUILD, as a module state_dict is.
    let p = b"ccollections\nOrderedDict\n)R}X\x09\x00\x00\x00_metadataK\x01sb.";
    let e = run(p).unwrap_err();
    assert!(e.message.contains("BUILD"), "{e}");
    let u = lenient(p).unwrap();
    assert_eq!(opaque(&u), Some("<dict given state by BUILD>"));
    // The shared None is never turned into a placeholder.
    assert!(lenient(b"N}X\x01\x00\x00\x00aK\x01sb.").is_err());
}

#[test]
fn placeholders_obey_the_caps() {
    let names: Vec<u8> = b"cfoo\nBar\n0"
        .repeat(20)
        .into_iter()
        .chain(*b"N.")
        .collect();
    let limits = Limits {
        max_values: 10,
        ..Limits::default()
    };
    let e = unpickle_with_policy(&names, limits, UnknownGlobals::Placeholder).unwrap_err();
    assert!(e.message.contains("values"), "{e}");
    let limits = Limits {
        max_string_bytes: 50,
        ..Limits::default()
    };
    let e = unpickle_with_policy(&names, limits, UnknownGlobals::Placeholder).unwrap_err();
    assert!(e.message.contains("strings"), "{e}");
    // A 10k-character class name is clipped in the placeholder.
    let mut long = b"c".to_vec();
    long.extend(vec![b'm'; 10_000]);
    long.extend(b"\nX\n.");
    let u = lenient(&long).unwrap();
    assert!(opaque(&u).is_some_and(|n| n.len() < 500));
}

#[test]
fn find_opaque_walks_shared_and_cyclic_graphs() {
    // l = [l, {'k': (1, Cfg())}]
    let p = b"]q\x00(h\x00}X\x01\x00\x00\x00kK\x01cfoo\nCfg\n)\x81\x86se.";
    let u = lenient(p).unwrap();
    assert_eq!(u.find_opaque(u.root), Some("foo.Cfg"));
    assert_eq!(u.any_opaque(), Some("foo.Cfg"));
    let u = lenient(b"]q\x00(h\x00K\x01e.").unwrap();
    assert_eq!(u.find_opaque(u.root), None);
    assert_eq!(u.any_opaque(), None);
}

#[test]
fn placeholder_mode_never_panics_on_byte_soup() {
    let base = b"\x80\x02}(X\x05\x00\x00\x00hparsc__main__\nCfg\n)\x81}X\x01\x00\x00\x00aK\x01sbX\x03\x00\x00\x00optccopyreg\n_reconstructor\n(cfoo\nBar\ncbuiltins\nobject\nNtR\x82\x01\x86u.";
    assert!(lenient(base).is_ok());
    for_prefixes_and_byte_edits(base, 0x2545_f491_4f6c_dd1d, |bytes| {
        let _ = lenient(bytes);
    });
}

#[test]
fn a_value_stays_small() {
    // A state's pickle makes hundreds of values; a tensor is boxed so each
    // of them is the size of a storage (48 bytes), not of a tensor (128).
    assert!(
        std::mem::size_of::<Value>() <= 48,
        "{}",
        std::mem::size_of::<Value>()
    );
}
