//! Properties of the safetensors headers reader.

use super::*;

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
