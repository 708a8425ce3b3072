//! Properties of the zip archives reader.

use super::*;

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
pub(crate) enum ZipEdit {
    Put {
        at: prop::sample::Index,
        value: u32,
        width: u8,
    },
    Truncate(prop::sample::Index),
    Append(Vec<u8>),
}

pub(crate) fn zip_edit() -> impl Strategy<Value = ZipEdit> {
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

pub(crate) fn apply(mut data: Vec<u8>, edits: &[ZipEdit]) -> Vec<u8> {
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

/// An entry whose central-directory sizes claim more than the whole file is
/// refused when the archive is opened (the random edits above find this
/// only now and then).
#[test]
fn entry_larger_than_the_file_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = zip_bytes(&[("archive/data.pkl".to_string(), b"abc".to_vec())]);
    let cd = data.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    for field in [cd + 20, cd + 24] {
        data[field..field + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
    }
    let path = write_temp(&dir, "big.zip", &data);
    let e = Archive::open(&path)
        .err()
        .expect("an oversized entry must be refused");
    assert!(
        e.message.contains("past the end of the file"),
        "{}",
        e.message
    );
}
