//! Unit tests of the `torch.save` state dict reader, on files torch wrote
//! (`rust/testdata/make_bin_fixtures.py`) and mutations of them.

use std::ops::ControlFlow;
use std::path::PathBuf;

use super::*;
use crate::formats::tensor_data::{decode, Moments};
use crate::formats::torch_save::test_support::{with_edited_pickle, zip_bytes};
use crate::io::zip_archive::Archive;

fn state_dict(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("rust/testdata/state_dicts")
        .join(name)
}

fn adapter_bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("rust/testdata/weights_bin")
        .join(name)
        .join("adapter_model.bin")
}

fn info<'a>(data: &'a SafetensorsData, name: &str) -> &'a TensorInfo {
    let found = data.header().tensors.iter().find(|t| t.name == name);
    found.unwrap_or_else(|| panic!("no tensor {name}"))
}

/// Every value of tensor `name`, decoded.
fn values(data: &SafetensorsData, name: &str) -> Vec<f64> {
    let t = data.float_tensor(info(data, name)).unwrap();
    let mut out = Vec::new();
    data.reader(5)
        .for_each_raw_chunk(&t, |bytes| {
            let mut vals = vec![0.0; bytes.len() / t.kind.size()];
            decode(t.kind, bytes, &mut vals);
            out.extend(vals);
            ControlFlow::Continue(())
        })
        .unwrap();
    out
}

fn moments(data: &SafetensorsData, name: &str) -> Moments {
    let t = data.float_tensor(info(data, name)).unwrap();
    data.reader(7).moments(&t).unwrap()
}

#[test]
fn every_float_dtype_reads_as_torch_wrote_it() {
    let data = open_state_dict(&state_dict("dtypes.bin")).unwrap();
    let names: Vec<(&str, &str, &[u64])> = data
        .header()
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.dtype.as_str(), t.shape.as_slice()))
        .collect();
    // Sorted by name, as a safetensors header lists them.
    assert_eq!(
        names,
        [
            ("b", "BF16", &[4, 6][..]),
            ("d", "F64", &[4, 6][..]),
            ("h", "F16", &[4, 6][..]),
            ("s", "F32", &[][..]),
        ]
    );
    assert_eq!(values(&data, "s"), [2.5]);
    // The same randn values at three precisions.
    let d = values(&data, "d");
    for (name, eps) in [("h", 1.0 / 1024.0), ("b", 1.0 / 128.0)] {
        let v = values(&data, name);
        assert_eq!(v.len(), 24);
        for (a, b) in v.iter().zip(&d) {
            assert!(
                (a - b).abs() <= eps * b.abs().max(1e-3),
                "{name}: {a} vs {b}"
            );
        }
    }
    assert_eq!(moments(&data, "d").numel, 24);
}

#[test]
fn views_of_one_storage_read_their_own_elements() {
    let data = open_state_dict(&state_dict("shared.bin")).unwrap();
    let a = values(&data, "a");
    let b = values(&data, "b");
    assert_eq!((a.len(), b.len()), (24, 18));
    // b is a[1:] of a 4 x 6 tensor: a's values from the second row on.
    assert_eq!(b, a[6..]);
    let (sa, sb) = (info(&data, "a"), info(&data, "b"));
    assert_eq!(sb.data_offsets.0, sa.data_offsets.0 + 6 * 4);
    assert_eq!(sb.data_offsets.1, sa.data_offsets.1);
}

#[test]
fn shared_views_are_charged_to_the_budget() {
    let path = state_dict("shared.bin");
    let save = TorchSave::open(&path, UnknownGlobals::Refuse).unwrap();
    assert!(tensor_spans(&save, &mut WorkBudget::of_elements(42)).is_ok());
    let e = tensor_spans(&save, &mut WorkBudget::of_elements(41)).unwrap_err();
    assert!(
        e.message.contains("far more data than the file holds"),
        "{e}"
    );
}

#[test]
fn shapes_that_are_not_a_state_dict_of_tensors_are_refused_by_name() {
    let cases = [
        ("transposed.bin", "tensor \"w\" is not contiguous"),
        ("not_a_tensor.bin", "entry \"step\" is a int, not a tensor"),
        ("list.bin", "holds a list, not a state dict"),
        ("legacy.bin", "legacy (pre-1.6, not zip)"),
    ];
    for (file, says) in cases {
        let e = open_state_dict(&state_dict(file)).unwrap_err();
        assert_eq!(e.area, Area::Weights, "{file}: {e}");
        assert!(e.message.contains(says), "{file}: {e}");
    }
    // A non-float tensor opens (its name and shape are read) but is not
    // taken as float data.
    let data = open_state_dict(&state_dict("int_tensor.bin")).unwrap();
    let ids = info(&data, "ids");
    assert_eq!(
        (ids.dtype.as_str(), ids.shape.as_slice()),
        ("int64", &[4][..])
    );
    let e = data.float_tensor(ids).unwrap_err();
    assert!(e.message.contains("dtype int64"), "{e}");
}

#[test]
fn a_global_outside_the_allow_list_is_refused_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = with_edited_pickle(
        &adapter_bin("llama_trained"),
        dir.path(),
        "adapter_model.bin",
        |pkl| {
            let from = b"torch._utils\n_rebuild_tensor_v2\n";
            let at = pkl.windows(from.len()).position(|w| w == from).unwrap();
            pkl.splice(at..at + from.len(), b"os\nsystem\n".iter().copied());
        },
    );
    let e = open_state_dict(&path).unwrap_err();
    assert_eq!(e.area, Area::UnsafePickle, "{e}");
    assert!(e
        .details
        .contains(&("global_name", "os.system".to_string())));
    assert!(read_tensor_header(&path).is_err());
}

#[test]
fn a_compressed_storage_is_refused() {
    let src = adapter_bin("llama_nan");
    let archive = Archive::open(&src).unwrap();
    let mut names: Vec<&String> = archive.entries.keys().collect();
    names.sort();
    let entries: Vec<(String, Vec<u8>)> = names
        .into_iter()
        .map(|n| {
            let e = archive.entry(n).unwrap();
            let mut buf = Vec::new();
            archive.read_entry_range(n, e, 0, e.size, &mut buf).unwrap();
            (n.clone(), buf)
        })
        .collect();
    let refs: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adapter_model.bin");
    // The same bytes, claimed DEFLATEd: nothing may read them as STORED.
    std::fs::write(&path, zip_bytes(&refs, 8)).unwrap();
    let e = open_state_dict(&path).unwrap_err();
    assert_eq!(e.area, Area::Weights);
    assert!(e.message.contains("compressed"), "{e}");
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = std::fs::read(adapter_bin("llama_nan")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adapter_model.bin");
    let mut cuts: Vec<usize> = (0..bytes.len()).step_by(97).collect();
    cuts.extend(bytes.len().saturating_sub(200)..bytes.len());
    for cut in cuts {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        // The zip's directory is at the end: every cut loses it.
        let e = open_state_dict(&path).unwrap_err();
        assert_eq!(e.area, Area::Weights, "cut at {cut}: {e}");
    }
}

#[test]
fn the_extension_picks_the_reader() {
    assert!(is_torch_file(Path::new("a/adapter_model.bin")));
    assert!(is_torch_file(Path::new("x.pt")) && is_torch_file(Path::new("x.pth")));
    assert!(!is_torch_file(Path::new("adapter_model.safetensors")));
    assert!(!is_torch_file(Path::new("bin")));
    let header = read_tensor_header(&adapter_bin("llama_trained")).unwrap();
    assert!(header
        .tensors
        .iter()
        .all(|t| t.name.starts_with("base_model.model.")));
}
