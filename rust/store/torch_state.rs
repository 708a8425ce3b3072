//! Reads dlm's `training_state.pt` without torch: the few fields
//! gradient_ghost needs (global_step, epoch, best_val_loss, use_qlora) and
//! the per-parameter second-moment statistics of its
//! `optimizer_state_dict`.
//!
//! The archive and pickle handling live in `torch_save`, the optimizer
//! walk (Adam, bitsandbytes and Adafactor layouts) in `optimizer_state`,
//! shared with the reader of HF and Lightning files; this module adds dlm's
//! payload fields, its sha256 sidecar and the rule that a dlm state must
//! carry a second moment.

use std::path::{Path, PathBuf};

pub use crate::analysis::second_moment::ParamStat;
use crate::error::{Area, Error, Result};
use crate::formats::pickle::{UnknownGlobals, Value};
use crate::formats::torch_save::TorchSave;
use crate::io::read_once::{self, Kind};
use crate::io::sidecar;
use crate::store::optimizer_state::summarize;

/// File name inside an adapter version directory.
pub const STATE_FILE: &str = "training_state.pt";

/// What gradient_ghost needs from a `training_state.pt`.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingState {
    /// The `.pt` file that was read.
    pub path: PathBuf,
    pub global_step: i64,
    pub epoch: Option<f64>,
    /// NaN when the payload has none.
    pub best_val_loss: f64,
    pub use_qlora: bool,
    /// One entry per optimizer state, ordered by param id.
    pub per_param: Vec<ParamStat>,
    /// Values no optimizer writes (see `store::plausibility`); empty when
    /// the state is plausible.
    pub implausible: Vec<String>,
}

/// Read `path`, an adapter version directory or the `.pt` file itself.
/// When `<file>.sha256` sits beside the file it must match the file's
/// digest, else the read fails with `Area::Integrity`. An optimizer state
/// without a second moment (SGD, ...) is refused as a foreign state:
/// `optimizer_state::read_optimizer_state` reports those without an error.
pub fn read_training_state(path: &Path) -> Result<TrainingState> {
    let file = resolve(path)?;
    sidecar::verified(&file, || parse_state(&file))
}

fn resolve(path: &Path) -> Result<PathBuf> {
    // The store's memo answers the common case; a miss asks again for the error.
    let error = |p: &Path| match std::fs::metadata(p) {
        Err(e) => Error::io(Area::TrainingState, p, &e),
        Ok(_) => Error::new(Area::TrainingState, p, "is not a regular file"),
    };
    match read_once::kind(path) {
        Kind::Dir => {
            let file = path.join(STATE_FILE);
            match read_once::kind(&file) {
                Kind::File => Ok(file),
                _ => Err(error(&file)),
            }
        }
        Kind::Missing => Err(error(path)),
        Kind::File | Kind::Other => Ok(path.to_path_buf()),
    }
}

fn parse_state(file: &Path) -> Result<TrainingState> {
    let ts = TorchSave::open(file, UnknownGlobals::Refuse)?;
    let g = &ts.graph;
    let root = g.root;
    let keys = |id| g.dict_str_keys(id).join(", ");
    if g.dict_entries(root).is_none() {
        return Err(ts.err(format!(
            "payload is a {}, not the dict dlm writes",
            g.get(root).kind()
        )));
    }
    let field = |name: &str| g.dict_get(root, name).map(|id| g.get(id));
    let global_step = match field("global_step") {
        Some(Value::Int(i)) => *i,
        Some(other) => return Err(ts.err(format!("global_step is a {}, not an int", other.kind()))),
        None => return Err(ts.err(format!("payload has no global_step (keys: {})", keys(root)))),
    };
    let epoch = match field("epoch") {
        None | Some(Value::None) => None,
        Some(Value::Float(f)) => Some(*f),
        Some(Value::Int(i)) => Some(*i as f64),
        Some(other) => return Err(ts.err(format!("epoch is a {}, not a float", other.kind()))),
    };
    let best_val_loss = match field("best_val_loss") {
        None | Some(Value::None) => f64::NAN,
        Some(Value::Float(f)) => *f,
        Some(Value::Int(i)) => *i as f64,
        Some(other) => {
            return Err(ts.err(format!("best_val_loss is a {}, not a float", other.kind())))
        }
    };
    let use_qlora = match field("use_qlora") {
        None | Some(Value::None) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(ts.err(format!("use_qlora is a {}, not a bool", other.kind()))),
    };
    let optim = g.dict_get(root, "optimizer_state_dict").ok_or_else(|| {
        ts.err(format!(
            "payload has no optimizer_state_dict (keys: {})",
            keys(root)
        ))
    })?;
    let summary = summarize(&ts, optim, "optimizer_state_dict", false)?;
    if let Some((param_id, slot_keys)) = summary.without_second_moment {
        return Err(ts
            .err(format!(
                "foreign state: optimizer state of param {param_id} has keys [{slot_keys}] and no \
             second moment to judge ({}); refusing to guess",
                summary.no_second_moment.unwrap_or_default()
            ))
            .with("optimizer", summary.optimizer));
    }
    Ok(TrainingState {
        path: ts.path().to_path_buf(),
        global_step,
        epoch,
        best_val_loss,
        use_qlora,
        per_param: summary.per_param,
        implausible: summary.implausible,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::torch_save::test_support::zip_bytes;
    use sha2::{Digest, Sha256};
    use std::io::Write;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        p
    }

    /// A minimal dlm payload: one param whose exp_avg_sq is a float32
    /// view of `size` elements over storage '0' of `numel` elements.
    /// Peak resident memory of this process so far (Linux), in bytes.
    fn peak_rss() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    #[test]
    fn a_sparse_file_claiming_gigabytes_is_reduced_in_bounded_memory() {
        // 300M float32 elements = 1.2 GB of storage that the file only
        // claims: its data region is a hole, so it costs no disk.
        let numel: u32 = 300_000_000;
        let mut pkl =
            b"\x80\x02}(X\x0b\x00\x00\x00global_stepK\x07X\x14\x00\x00\x00optimizer_state_dict}"
                .to_vec();
        pkl.extend(b"X\x05\x00\x00\x00state}K\x00}X\x0a\x00\x00\x00exp_avg_sq");
        pkl.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ");
        pkl.extend(numel.to_le_bytes());
        pkl.extend(b"tQK\x00J");
        pkl.extend(numel.to_le_bytes());
        pkl.extend(b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRsssu.");
        let head = zip_bytes(&[("s/data.pkl", &pkl), ("s/byteorder", b"little")], 0);
        // Re-lay the archive: the two small entries, then a stored entry of
        // `numel * 4` bytes left as a hole, then a central directory for all three.
        let eocd = head.len() - 22;
        let cd_off = u32::from_le_bytes(head[eocd + 16..eocd + 20].try_into().unwrap()) as usize;
        let mut bytes = head[..cd_off].to_vec();
        let name = b"s/data/0";
        let size = u64::from(numel) * 4;
        let data_off = bytes.len() as u32;
        bytes.extend(0x0403_4b50u32.to_le_bytes());
        bytes.extend([20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        bytes.extend((size as u32).to_le_bytes());
        bytes.extend((size as u32).to_le_bytes());
        bytes.extend((name.len() as u16).to_le_bytes());
        bytes.extend(0u16.to_le_bytes());
        bytes.extend(name);
        let data_start = bytes.len() as u64;
        let mut cd = head[cd_off..eocd].to_vec();
        cd.extend(0x0201_4b50u32.to_le_bytes());
        cd.extend([20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        cd.extend((size as u32).to_le_bytes());
        cd.extend((size as u32).to_le_bytes());
        cd.extend((name.len() as u16).to_le_bytes());
        cd.extend([0; 12]);
        cd.extend(data_off.to_le_bytes());
        cd.extend(name);
        let cd_start = data_start + size;
        let mut tail = cd.clone();
        tail.extend(0x0605_4b50u32.to_le_bytes());
        tail.extend([0; 4]);
        tail.extend(3u16.to_le_bytes());
        tail.extend(3u16.to_le_bytes());
        tail.extend((cd.len() as u32).to_le_bytes());
        tail.extend((cd_start as u32).to_le_bytes());
        tail.extend([0; 2]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        {
            use std::io::{Seek, SeekFrom};
            let mut f = std::fs::File::create(&path).unwrap();
            f.write_all(&bytes).unwrap();
            f.seek(SeekFrom::Start(cd_start)).unwrap();
            f.write_all(&tail).unwrap();
        }
        let before = peak_rss();
        let state = read_training_state(&path).unwrap();
        assert_eq!(state.per_param[0].numel, u64::from(numel));
        assert_eq!(state.per_param[0].exp_avg_sq_mean, 0.0);
        if let (Some(a), Some(b)) = (before, peak_rss()) {
            assert!(b - a < 256 << 20, "peak RSS grew by {} MB", (b - a) >> 20);
        }
    }

    fn payload(numel: u8, size: u8, exp_key: &str) -> Vec<u8> {
        let mut p = b"\x80\x02}(X\x0b\x00\x00\x00global_stepK\x07X\x05\x00\x00\x00epochG".to_vec();
        p.extend(1.5f64.to_be_bytes());
        p.extend(b"X\x09\x00\x00\x00use_qlora\x88");
        p.extend(b"X\x14\x00\x00\x00optimizer_state_dict}X\x05\x00\x00\x00state}K\x03}");
        p.push(b'X');
        p.extend((exp_key.len() as u32).to_le_bytes());
        p.extend(exp_key.as_bytes());
        p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK");
        p.push(numel);
        p.extend(b"tQK\x00K");
        p.push(size);
        p.extend(b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRsssu.");
        p
    }

    fn floats(vals: &[f32]) -> Vec<u8> {
        vals.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn reads_a_minimal_archive() {
        let dir = tempfile::tempdir().unwrap();
        let data = floats(&[1.0, 2.0, 3.0, 6.0]);
        let z = zip_bytes(
            &[
                ("arch/data.pkl", &payload(4, 4, "exp_avg_sq")),
                ("arch/byteorder", b"little"),
                ("arch/data/0", &data),
            ],
            0,
        );
        let p = write(dir.path(), STATE_FILE, &z);
        let s = read_training_state(dir.path()).unwrap();
        assert_eq!(s.path, p);
        assert_eq!(s.global_step, 7);
        assert_eq!(s.epoch, Some(1.5));
        assert!(s.best_val_loss.is_nan());
        assert!(s.use_qlora);
        assert_eq!(
            s.per_param,
            vec![ParamStat {
                param_id: 3,
                numel: 4,
                shape: vec![4],
                exp_avg_sq_mean: 3.0,
                nonfinite: 0
            }]
        );

        // A correct sidecar passes; a wrong one is an integrity error.
        let digest: String = Sha256::digest(&z)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        write(
            dir.path(),
            "training_state.pt.sha256",
            format!("{digest}  training_state.pt\n").as_bytes(),
        );
        assert!(read_training_state(&p).is_ok());
        let mut wrong = digest.into_bytes();
        wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
        write(dir.path(), "training_state.pt.sha256", &wrong);
        assert_eq!(read_training_state(&p).unwrap_err().area, Area::Integrity);
        write(dir.path(), "training_state.pt.sha256", b"not a digest");
        assert_eq!(read_training_state(&p).unwrap_err().area, Area::Integrity);
    }

    #[test]
    fn broken_archives_give_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let data = floats(&[1.0, 2.0, 3.0, 6.0]);
        let pkl = payload(4, 4, "exp_avg_sq");
        let cases: Vec<(&str, Vec<u8>, Area, &str)> = vec![
            (
                "soup.pt",
                b"random bytes, not a zip at all".to_vec(),
                Area::TrainingState,
                "not a zip",
            ),
            (
                "nopkl.pt",
                zip_bytes(&[("arch/data/0", &data)], 0),
                Area::TrainingState,
                "data.pkl",
            ),
            (
                "nokey.pt",
                zip_bytes(&[("arch/data.pkl", &pkl)], 0),
                Area::TrainingState,
                "missing",
            ),
            (
                "past.pt",
                zip_bytes(
                    &[
                        ("arch/data.pkl", &payload(4, 5, "exp_avg_sq")),
                        ("arch/data/0", &data),
                    ],
                    0,
                ),
                Area::TrainingState,
                "past the end",
            ),
            (
                "short.pt",
                zip_bytes(
                    &[
                        ("arch/data.pkl", &payload(9, 4, "exp_avg_sq")),
                        ("arch/data/0", &data),
                    ],
                    0,
                ),
                Area::TrainingState,
                "claims",
            ),
            (
                "foreign.pt",
                zip_bytes(
                    &[
                        ("arch/data.pkl", &payload(4, 4, "state1")),
                        ("arch/data/0", &data),
                    ],
                    0,
                ),
                Area::TrainingState,
                "foreign state",
            ),
            (
                "deflate.pt",
                zip_bytes(&[("arch/data.pkl", &pkl), ("arch/data/0", &data)], 8),
                Area::TrainingState,
                "compressed",
            ),
        ];
        for (name, bytes, area, needle) in cases {
            let p = write(dir.path(), name, &bytes);
            let e = read_training_state(&p).unwrap_err();
            assert_eq!(e.area, area, "{name}: {e}");
            assert!(e.to_string().contains(needle), "{name}: {e}");
            assert!(e.to_string().contains(name), "{name}: {e}");
            // Every truncation must fail cleanly too.
            for cut in [
                1,
                bytes.len() / 3,
                bytes.len() / 2,
                bytes.len().saturating_sub(1),
            ] {
                let p = write(dir.path(), "cut.pt", &bytes[..cut.min(bytes.len())]);
                assert!(read_training_state(&p).is_err());
            }
        }
        let e = read_training_state(&dir.path().join("absent")).unwrap_err();
        assert_eq!(e.area, Area::Missing);
    }
}
