//! Properties of the `torch.save` state dict reader (`adapter_model.bin`),
//! on a real file torch wrote with byte edits, truncations and appends.

use adapterprobe_core::formats::torch_state_dict::open_state_dict;

use super::zip_archive::{apply, zip_edit};
use super::*;

fn real_bin() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("rust/testdata/weights_bin/llama_patterns_rslora_bf16/adapter_model.bin");
    std::fs::read(path).unwrap()
}

/// Open `path` and read every tensor it offers: whatever the bytes, no
/// panic; an error is a reader's error (never a pickle run); every tensor
/// taken lies inside the file, and their elements add up to no more than
/// the archive's work budget.
fn check_state_dict(path: &Path, file_len: u64) {
    let data = match open_state_dict(path) {
        Ok(data) => data,
        Err(e) => {
            assert!(
                matches!(e.area, Area::Weights | Area::UnsafePickle),
                "{:?}: {e}",
                e.area
            );
            return;
        }
    };
    let mut elements = 0u64;
    let mut reader = data.reader(37);
    for info in &data.header().tensors {
        let Ok(t) = data.float_tensor(info) else {
            continue;
        };
        assert!(t.offset + t.byte_len <= file_len, "{} past the end", t.name);
        elements += t.numel;
        if let Err(e) = reader.moments(&t) {
            assert_eq!(e.area, Area::Weights);
        }
    }
    assert!(elements <= file_len * 2 + (1 << 26));
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mutated_state_dicts_never_panic_or_read_outside_the_file(
        edits in prop::collection::vec(zip_edit(), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = apply(real_bin(), &edits);
        let path = write_temp(&dir, "adapter_model.bin", &data);
        check_state_dict(&path, data.len() as u64);
    }

    #[test]
    fn state_dict_reader_never_panics_on_bytes(data in prop::collection::vec(any::<u8>(), 0..300)) {
        let dir = tempfile::tempdir().unwrap();
        let path = write_temp(&dir, "adapter_model.bin", &data);
        check_state_dict(&path, data.len() as u64);
    }
}

#[test]
fn the_real_file_reads_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = real_bin();
    let path = write_temp(&dir, "adapter_model.bin", &data);
    let opened = open_state_dict(&path).unwrap();
    assert!(!opened.header().tensors.is_empty());
    check_state_dict(&path, data.len() as u64);
}
