//! Reads dlm's `training_state.pt` without torch: zip archive → allow-listed
//! pickle → the few fields gradient_ghost needs, with per-parameter
//! `exp_avg_sq` statistics reduced straight from the raw storage bytes.
//!
//! `torch.save` writes a zip (read by `zip_archive`) whose `<prefix>/data.pkl`
//! holds the object graph (read by the allow-listed `pickle` interpreter) and
//! `<prefix>/data/<key>` the little-endian bytes of each storage (reduced by
//! `float_reduce`). This module walks the payload to the fields we need and
//! checks the sha256 sidecar.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Area, Error, Result};
use crate::files::open_regular;
use crate::float_reduce::{plan_view, reduce_planned, FloatKind, Reduction};
use crate::pickle::{self, Tensor, Unpickled, Value};
use crate::zip_archive::Archive;

/// File name inside an adapter version directory.
pub const STATE_FILE: &str = "training_state.pt";

/// Statistics of one parameter's Adam second moment.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct ParamStat {
    pub param_id: i64,
    pub numel: u64,
    /// Shape of the state tensor (the parameter's shape).
    pub shape: Vec<u64>,
    /// Mean over all elements, accumulated in f64; NaN when any element is
    /// NaN or the tensor is empty.
    pub exp_avg_sq_mean: f64,
    /// Elements that are NaN or ±inf.
    pub nonfinite: u64,
}

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
}

/// Read `path`, an adapter version directory or the `.pt` file itself.
/// When `<file>.sha256` sits beside the file it must match the file's
/// digest, else the read fails with `Area::Integrity`.
pub fn read_training_state(path: &Path) -> Result<TrainingState> {
    let file = resolve(path)?;
    match read_sidecar(&file)? {
        None => parse_state(&file),
        Some(expected) => {
            // Hash and parse in parallel; the digest verdict wins over any
            // parse error, since a tampered file explains both.
            let (digest, parsed) = rayon::join(|| sha256_file(&file), || parse_state(&file));
            let digest = digest?;
            if digest != expected {
                return Err(Error::new(
                    Area::Integrity,
                    &file,
                    format!(
                        "sha256 is {digest} but {} records {expected}; the file was \
                         modified or corrupted after it was written",
                        sidecar_path(&file).display()
                    ),
                )
                .with("expected", expected)
                .with("actual", digest));
            }
            parsed
        }
    }
}

fn resolve(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(Area::TrainingState, path, &e))?;
    if meta.is_dir() {
        let file = path.join(STATE_FILE);
        match std::fs::metadata(&file) {
            Ok(m) if m.is_file() => Ok(file),
            Ok(_) => Err(Error::new(
                Area::TrainingState,
                &file,
                "is not a regular file",
            )),
            Err(e) => Err(Error::io(Area::TrainingState, &file, &e)),
        }
    } else {
        Ok(path.to_path_buf())
    }
}

fn sidecar_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The lowercase hex digest recorded beside `file`, if there is a sidecar.
fn read_sidecar(file: &Path) -> Result<Option<String>> {
    let side = sidecar_path(file);
    let handle = match open_regular(&side, Area::Integrity) {
        Ok(f) => f,
        Err(e) if e.area == Area::Missing => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = Vec::new();
    handle
        .take(4097)
        .read_to_end(&mut text)
        .map_err(|e| Error::io(Area::Integrity, &side, &e))?;
    let token = std::str::from_utf8(&text)
        .ok()
        .filter(|_| text.len() <= 4096)
        .and_then(|t| t.split_whitespace().next())
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()));
    match token {
        Some(t) => Ok(Some(t.to_ascii_lowercase())),
        None => Err(Error::new(
            Area::Integrity,
            &side,
            "is not a sha256 sidecar (expected 64 hex digits)",
        )),
    }
}

fn sha256_file(file: &Path) -> Result<String> {
    let mut f = open_regular(file, Area::TrainingState)?;
    let mut hasher = Sha256::new();
    // A buffer the size of the file, up to 1 MiB: small states (most of a
    // store scan) must not pay for zeroing a large buffer each.
    let len = f.metadata().map_or(1 << 20, |m| m.len());
    let mut buf = vec![0u8; len.clamp(4096, 1 << 20) as usize];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(Area::TrainingState, file, &e))?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn parse_state(file: &Path) -> Result<TrainingState> {
    let archive = Archive::open(file)?;
    let mut prefixes: Vec<&str> = archive
        .entries
        .keys()
        .filter_map(|n| n.strip_suffix("/data.pkl"))
        .filter(|p| !p.is_empty() && !p.contains('/'))
        .collect();
    prefixes.sort_unstable();
    let prefix = match prefixes.as_slice() {
        [one] => (*one).to_owned(),
        [] => {
            return Err(archive
                .err("zip archive has no <prefix>/data.pkl entry, so it is not a torch.save file"))
        }
        many => {
            return Err(archive.err(format!(
                "zip archive has {} data.pkl entries ({}); refusing to guess",
                many.len(),
                many.join(", ")
            )))
        }
    };
    let mut buf = Vec::new();
    let byteorder = format!("{prefix}/byteorder");
    if let Some(e) = archive.entry(&byteorder) {
        if e.size <= 16 {
            archive.read_entry_range(&byteorder, e, 0, e.size, &mut buf)?;
            if buf.as_slice() != b"little" {
                return Err(archive.err(format!(
                    "storages are {} endian; only little-endian files are read",
                    String::from_utf8_lossy(&buf)
                )));
            }
        }
    }
    let pkl_name = format!("{prefix}/data.pkl");
    let limits = pickle::Limits::default();
    let pkl = archive
        .entry(&pkl_name)
        .ok_or_else(|| archive.err("data.pkl vanished"))?;
    if pkl.size > limits.max_pickle_bytes as u64 {
        return Err(archive.err(format!(
            "{pkl_name} is {} bytes, more than the {} byte limit",
            pkl.size, limits.max_pickle_bytes
        )));
    }
    archive.read_entry_range(&pkl_name, pkl, 0, pkl.size, &mut buf)?;
    let graph = pickle::unpickle_with(&buf, limits).map_err(|e| {
        let err = Error::new(e.area, file, format!("{pkl_name}: {e}"));
        match e.global {
            Some(global) => err.with("global_name", global),
            None => err,
        }
    })?;
    Walker {
        archive: &archive,
        prefix: &prefix,
        graph: &graph,
    }
    .state()
}

/// More keys than any optimizer keeps per parameter (Adam has 3-4).
const MAX_SLOT_KEYS: usize = 64;

struct Walker<'a> {
    archive: &'a Archive,
    prefix: &'a str,
    graph: &'a Unpickled,
}

impl Walker<'_> {
    fn err(&self, message: impl Into<String>) -> Error {
        self.archive.err(message)
    }

    fn keys(&self, id: pickle::Id) -> String {
        self.graph.dict_str_keys(id).join(", ")
    }

    fn state(&self) -> Result<TrainingState> {
        let g = self.graph;
        let root = g.root;
        if g.dict_entries(root).is_none() {
            return Err(self.err(format!(
                "payload is a {}, not the dict dlm writes",
                g.get(root).kind()
            )));
        }
        let field = |name: &str| g.dict_get(root, name).map(|id| g.get(id));
        let global_step = match field("global_step") {
            Some(Value::Int(i)) => *i,
            Some(other) => {
                return Err(self.err(format!("global_step is a {}, not an int", other.kind())))
            }
            None => {
                return Err(self.err(format!(
                    "payload has no global_step (keys: {})",
                    self.keys(root)
                )))
            }
        };
        let epoch = match field("epoch") {
            None | Some(Value::None) => None,
            Some(Value::Float(f)) => Some(*f),
            Some(Value::Int(i)) => Some(*i as f64),
            Some(other) => {
                return Err(self.err(format!("epoch is a {}, not a float", other.kind())))
            }
        };
        let best_val_loss = match field("best_val_loss") {
            None | Some(Value::None) => f64::NAN,
            Some(Value::Float(f)) => *f,
            Some(Value::Int(i)) => *i as f64,
            Some(other) => {
                return Err(self.err(format!("best_val_loss is a {}, not a float", other.kind())))
            }
        };
        let use_qlora = match field("use_qlora") {
            None | Some(Value::None) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(self.err(format!("use_qlora is a {}, not a bool", other.kind())))
            }
        };
        let optim = g.dict_get(root, "optimizer_state_dict").ok_or_else(|| {
            self.err(format!(
                "payload has no optimizer_state_dict (keys: {})",
                self.keys(root)
            ))
        })?;
        if g.dict_entries(optim).is_none() {
            return Err(self.err(format!(
                "optimizer_state_dict is a {}, not a dict",
                g.get(optim).kind()
            )));
        }
        let state = g.dict_get(optim, "state").ok_or_else(|| {
            self.err(format!(
                "optimizer_state_dict has no 'state' (keys: {})",
                self.keys(optim)
            ))
        })?;
        let entries = g.dict_entries(state).ok_or_else(|| {
            self.err(format!(
                "optimizer_state_dict['state'] is a {}, not a dict",
                g.get(state).kind()
            ))
        })?;
        // Last duplicate wins, as in a Python dict; BTreeMap orders by id.
        let mut by_id: BTreeMap<i64, pickle::Id> = BTreeMap::new();
        for (k, v) in entries {
            match g.get(*k) {
                Value::Int(id) => {
                    by_id.insert(*id, *v);
                }
                other => {
                    return Err(self.err(format!(
                        "optimizer state key is a {}, not an int param id",
                        other.kind()
                    )))
                }
            }
        }
        let mut scratch = Vec::new();
        let mut per_param = Vec::with_capacity(by_id.len());
        // Work budget in elements: a legitimate state reduces at most the
        // storage it holds, so shared or overlapping views that add up to far
        // more than the file are an amplification attack, not data.
        let mut budget = self.archive.len.saturating_mul(2).saturating_add(1 << 26);
        for (param_id, slot) in by_id {
            match g.dict_entries(slot) {
                None => {
                    return Err(self.err(format!(
                        "optimizer state of param {param_id} is a {}, not a dict",
                        g.get(slot).kind()
                    )))
                }
                Some(entries) if entries.len() > MAX_SLOT_KEYS => {
                    return Err(self.err(format!(
                        "optimizer state of param {param_id} has {} entries; an optimizer \
                         keeps a handful per parameter",
                        entries.len()
                    )))
                }
                Some(_) => {}
            }
            let tensor = match g.dict_get(slot, "exp_avg_sq").map(|id| g.get(id)) {
                Some(Value::Tensor(t)) => t,
                Some(other) => {
                    return Err(self.err(format!(
                        "exp_avg_sq of param {param_id} is a {}, not a tensor",
                        other.kind()
                    )))
                }
                None => {
                    return Err(self.err(format!(
                        "foreign state: optimizer state of param {param_id} has keys [{}] \
                         and no exp_avg_sq (not an Adam-family optimizer, e.g. 8-bit or SGD); \
                         refusing to guess",
                        self.keys(slot)
                    )))
                }
            };
            let what = format!("exp_avg_sq of param {param_id}");
            let r = self.reduce(tensor, &what, &mut scratch, &mut budget)?;
            per_param.push(ParamStat {
                param_id,
                numel: r.numel,
                shape: tensor.size.clone(),
                exp_avg_sq_mean: r.mean(),
                nonfinite: r.nonfinite,
            });
        }
        Ok(TrainingState {
            path: self.archive.path.clone(),
            global_step,
            epoch,
            best_val_loss,
            use_qlora,
            per_param,
        })
    }

    fn reduce(
        &self,
        t: &Tensor,
        what: &str,
        scratch: &mut Vec<u8>,
        budget: &mut u64,
    ) -> Result<Reduction> {
        let kind = FloatKind::of(t.dtype).ok_or_else(|| {
            self.err(format!(
                "{what} has dtype {}; only float32, float16, bfloat16 and float64 are read",
                t.dtype.name
            ))
        })?;
        let key = self
            .graph
            .str_of(t.storage.key)
            .ok_or_else(|| self.err(format!("{what}: storage key is not a string")))?;
        let name = format!("{}/data/{key}", self.prefix);
        let entry = self.archive.entry(&name).ok_or_else(|| {
            self.err(format!(
                "{what}: storage '{key}' is missing from the archive (no entry {name})"
            ))
        })?;
        let claimed = t
            .storage
            .numel
            .checked_mul(t.storage.dtype.size as u64)
            .ok_or_else(|| self.err(format!("{what}: storage size overflows")))?;
        if entry.size < claimed {
            return Err(self.err(format!(
                "{what}: storage '{key}' has {} bytes but the pickle claims {claimed}",
                entry.size
            )));
        }
        let capacity = claimed / kind.size() as u64;
        let plan = plan_view(t.offset, &t.size, &t.stride, capacity)
            .map_err(|m| self.err(format!("{what}: {m}")))?;
        if plan.numel == 0 {
            return Ok(Reduction::default());
        }
        let work = plan.numel.saturating_add(plan.span);
        *budget = budget.checked_sub(work).ok_or_else(|| {
            self.err(format!(
                "{what}: the exp_avg_sq views add up to far more data than the file holds \
                 (shared or overlapping views); refusing the work"
            ))
        })?;
        let es = kind.size() as u64;
        self.archive
            .read_entry_range(&name, entry, plan.first * es, plan.span * es, scratch)?;
        reduce_planned(scratch, kind, &plan).map_err(|m| self.err(format!("{what}: {m}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Write a STORED zip with the given entries.
    fn zip_bytes(entries: &[(&str, &[u8])], method: u16) -> Vec<u8> {
        let mut out = Vec::new();
        let mut cd = Vec::new();
        for (name, data) in entries {
            let off = out.len() as u32;
            out.extend(0x0403_4b50u32.to_le_bytes());
            out.extend([20, 0, 0, 0]);
            out.extend(method.to_le_bytes());
            out.extend([0; 8]); // time, date, crc
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((name.len() as u16).to_le_bytes());
            out.extend(0u16.to_le_bytes());
            out.extend(name.as_bytes());
            out.extend(*data);
            cd.extend(0x0201_4b50u32.to_le_bytes());
            cd.extend([20, 0, 20, 0, 0, 0]);
            cd.extend(method.to_le_bytes());
            cd.extend([0; 8]);
            cd.extend((data.len() as u32).to_le_bytes());
            cd.extend((data.len() as u32).to_le_bytes());
            cd.extend((name.len() as u16).to_le_bytes());
            cd.extend([0; 12]);
            cd.extend(off.to_le_bytes());
            cd.extend(name.as_bytes());
        }
        let cd_off = out.len() as u32;
        out.extend(&cd);
        out.extend(0x0605_4b50u32.to_le_bytes());
        out.extend([0; 4]);
        out.extend((entries.len() as u16).to_le_bytes());
        out.extend((entries.len() as u16).to_le_bytes());
        out.extend((cd.len() as u32).to_le_bytes());
        out.extend(cd_off.to_le_bytes());
        out.extend([0; 2]);
        out
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        p
    }

    /// A minimal dlm payload: one param whose exp_avg_sq is a float32
    /// view of `size` elements over storage '0' of `numel` elements.
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
