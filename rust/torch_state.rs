//! Reads dlm's `training_state.pt` without torch: zip archive → allow-listed
//! pickle → the few fields gradient_ghost needs, with per-parameter
//! `exp_avg_sq` statistics reduced straight from the raw storage bytes.
//!
//! `torch.save` writes a zip whose entries are STORED (uncompressed):
//! `<prefix>/data.pkl` holds the object graph and `<prefix>/data/<key>`
//! the little-endian bytes of each storage. We parse the zip central
//! directory ourselves, read only the pickle and the storages of the
//! tensors we reduce, and never trust a size the file claims before
//! checking it against the file.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Area, Error, Result};
use crate::files::open_regular;
use crate::pickle::{self, DType, Tensor, Unpickled, Value};
use crate::tensor_data::{dec_bf16, dec_f16, dec_f32, dec_f64};
pub use crate::tensor_data::{f16_to_f32, FloatKind};

/// File name inside an adapter version directory.
pub const STATE_FILE: &str = "training_state.pt";

/// Statistics of one parameter's Adam second moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamStat {
    pub param_id: i64,
    pub numel: u64,
    /// Mean over all elements, accumulated in f64; NaN when any element is
    /// NaN or the tensor is empty.
    pub exp_avg_sq_mean: f64,
    /// Elements that are NaN or ±inf.
    pub nonfinite: u64,
}

/// What gradient_ghost needs from a `training_state.pt`.
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
                ));
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

// ---------------------------------------------------------------------------
// zip archive

/// Caps on what a zip header may make us allocate.
const MAX_CENTRAL_DIR_BYTES: u64 = 64 << 20;
const MAX_ENTRIES: u64 = 1 << 20;
const EOCD_LEN: usize = 22;
const MAX_COMMENT: usize = 0xffff;

#[derive(Debug, Clone)]
struct Entry {
    size: u64,
    header_offset: u64,
    method: u16,
    flags: u16,
}

/// A zip archive opened for reading STORED entries.
struct Archive {
    path: PathBuf,
    file: File,
    len: u64,
    entries: HashMap<String, Entry>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        a.copy_from_slice(s);
    }
    u16::from_le_bytes(a)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

impl Archive {
    fn err(&self, message: impl Into<String>) -> Error {
        Error::new(Area::TrainingState, &self.path, message)
    }

    fn read_exact_at(&self, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(self.err(format!(
                "truncated archive: {len} bytes at offset {offset} run past the end ({} bytes)",
                self.len
            )));
        }
        buf.clear();
        let mut f = &self.file;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| Error::io(Area::TrainingState, &self.path, &e))?;
        let got = f
            .take(len)
            .read_to_end(buf)
            .map_err(|e| Error::io(Area::TrainingState, &self.path, &e))?;
        if got as u64 != len {
            return Err(self.err("file shrank while being read"));
        }
        Ok(())
    }

    fn open(path: &Path) -> Result<Archive> {
        let file = open_regular(path, Area::TrainingState)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(Area::TrainingState, path, &e))?
            .len();
        let mut archive = Archive {
            path: path.to_path_buf(),
            file,
            len,
            entries: HashMap::new(),
        };
        let not_zip = || {
            Error::new(
                Area::TrainingState,
                path,
                "not a zip archive (torch.save writes zip files; the legacy \
                 pre-1.6 format is not supported)",
            )
        };
        if len < EOCD_LEN as u64 {
            return Err(not_zip());
        }
        // The end-of-central-directory record sits in the last 22 + comment bytes.
        let tail_len = len.min((EOCD_LEN + MAX_COMMENT + 20) as u64);
        let mut tail = Vec::new();
        archive.read_exact_at(len - tail_len, tail_len, &mut tail)?;
        let eocd = (0..=tail.len() - EOCD_LEN)
            .rev()
            .find(|&i| le32(&tail, i) == 0x0605_4b50)
            .ok_or_else(not_zip)?;
        let mut total = u64::from(le16(&tail, eocd + 10));
        let mut cd_size = u64::from(le32(&tail, eocd + 12));
        let mut cd_offset = u64::from(le32(&tail, eocd + 16));
        // zip64: a locator right before the EOCD points at the real record.
        if eocd >= 20 && le32(&tail, eocd - 20) == 0x0706_4b50 {
            let rec_offset = le64(&tail, eocd - 20 + 8);
            let mut rec = Vec::new();
            archive.read_exact_at(rec_offset, 56, &mut rec)?;
            if le32(&rec, 0) != 0x0606_4b50 {
                return Err(archive.err("corrupt zip64 end-of-central-directory record"));
            }
            total = le64(&rec, 32);
            cd_size = le64(&rec, 40);
            cd_offset = le64(&rec, 48);
        }
        if total > MAX_ENTRIES || cd_size > MAX_CENTRAL_DIR_BYTES {
            return Err(archive.err(format!(
                "zip central directory claims {total} entries in {cd_size} bytes, over the \
                 limit ({MAX_ENTRIES} entries, {MAX_CENTRAL_DIR_BYTES} bytes)"
            )));
        }
        let mut cd = Vec::new();
        archive.read_exact_at(cd_offset, cd_size, &mut cd)?;
        archive.entries = parse_central_dir(&cd, total).map_err(|m| archive.err(m))?;
        Ok(archive)
    }

    /// Byte offset of an entry's data, after its local header.
    fn data_offset(&self, name: &str, e: &Entry) -> Result<u64> {
        if e.flags & 1 != 0 {
            return Err(self.err(format!("zip entry {name} is encrypted")));
        }
        if e.method != 0 {
            return Err(self.err(format!(
                "zip entry {name} is compressed (method {}); torch.save stores entries \
                 uncompressed and only those can be read",
                e.method
            )));
        }
        let mut header = Vec::new();
        self.read_exact_at(e.header_offset, 30, &mut header)?;
        if le32(&header, 0) != 0x0403_4b50 {
            return Err(self.err(format!("zip entry {name} has a corrupt local header")));
        }
        let skip = 30 + u64::from(le16(&header, 26)) + u64::from(le16(&header, 28));
        let start = e.header_offset + skip;
        if start.checked_add(e.size).map_or(true, |end| end > self.len) {
            return Err(self.err(format!(
                "zip entry {name} ({} bytes) runs past the end of the file",
                e.size
            )));
        }
        Ok(start)
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Read `len` bytes starting `skip` bytes into entry `name`.
    fn read_entry_range(
        &self,
        name: &str,
        e: &Entry,
        skip: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let start = self.data_offset(name, e)?;
        if skip.checked_add(len).map_or(true, |end| end > e.size) {
            return Err(self.err(format!("read past the end of zip entry {name}")));
        }
        self.read_exact_at(start + skip, len, buf)
    }
}

fn parse_central_dir(cd: &[u8], total: u64) -> std::result::Result<HashMap<String, Entry>, String> {
    let mut entries = HashMap::new();
    let mut at = 0usize;
    for _ in 0..total {
        let fixed = cd
            .get(at..at + 46)
            .ok_or("truncated zip central directory")?;
        if le32(fixed, 0) != 0x0201_4b50 {
            return Err("corrupt zip central directory entry".into());
        }
        let flags = le16(fixed, 8);
        let method = le16(fixed, 10);
        let mut csize = u64::from(le32(fixed, 20));
        let mut usize_ = u64::from(le32(fixed, 24));
        let name_len = usize::from(le16(fixed, 28));
        let extra_len = usize::from(le16(fixed, 30));
        let comment_len = usize::from(le16(fixed, 32));
        let mut header_offset = u64::from(le32(fixed, 42));
        let name_start = at + 46;
        let extra_start = name_start + name_len;
        let next = extra_start + extra_len + comment_len;
        let name = cd
            .get(name_start..extra_start)
            .ok_or("truncated zip central directory")?;
        let extra = cd
            .get(extra_start..extra_start + extra_len)
            .ok_or("truncated zip central directory")?;
        // zip64 extended information replaces the fields saturated at 0xffffffff.
        let mut x = 0usize;
        while x + 4 <= extra.len() {
            let id = le16(extra, x);
            let size = usize::from(le16(extra, x + 2));
            let body = extra.get(x + 4..x + 4 + size).unwrap_or_default();
            if id == 0x0001 {
                let mut field = 0usize;
                for slot in [&mut usize_, &mut csize, &mut header_offset] {
                    if *slot == 0xffff_ffff {
                        *slot = body
                            .get(field..field + 8)
                            .map(|_| le64(body, field))
                            .ok_or("truncated zip64 extra field")?;
                        field += 8;
                    }
                }
            }
            x += 4 + size;
        }
        if method == 0 && csize != usize_ {
            return Err("stored zip entry with differing sizes".into());
        }
        let name = String::from_utf8_lossy(name).into_owned();
        entries.insert(
            name,
            Entry {
                size: csize,
                header_offset,
                method,
                flags,
            },
        );
        at = next;
    }
    Ok(entries)
}

// ---------------------------------------------------------------------------
// payload walk

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
    let graph = pickle::unpickle_with(&buf, limits)
        .map_err(|e| Error::new(e.area, file, format!("{pkl_name}: {e}")))?;
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

// ---------------------------------------------------------------------------
// reduction kernels

impl FloatKind {
    /// The reducible float kind of a pickled torch dtype.
    pub fn of(d: DType) -> Option<FloatKind> {
        match d.name {
            "float32" => Some(FloatKind::F32),
            "float64" => Some(FloatKind::F64),
            "float16" => Some(FloatKind::F16),
            "bfloat16" => Some(FloatKind::BF16),
            _ => None,
        }
    }
}

/// Sum and non-finite count of a set of elements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reduction {
    pub numel: u64,
    pub sum: f64,
    pub nonfinite: u64,
}

impl Reduction {
    /// Mean in f64; NaN for an empty tensor, as torch gives.
    pub fn mean(&self) -> f64 {
        if self.numel == 0 {
            f64::NAN
        } else {
            self.sum / self.numel as f64
        }
    }
}

/// A validated tensor view, relative to the first element it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewPlan {
    pub numel: u64,
    /// First storage element read.
    pub first: u64,
    /// Elements from `first` through the last element read.
    pub span: u64,
    /// (size, stride) pairs, size-1 dims dropped and mergeable dims merged,
    /// outermost first. Empty for a scalar.
    pub dims: Vec<(u64, u64)>,
}

/// Logical elements a view may have beyond its storage's size (broadcast
/// views with stride 0); past this, such views are refused.
const MAX_OVERLAP_NUMEL: u64 = 1 << 24;

/// Check that the view (offset, size, stride) lies inside a storage of
/// `capacity` elements and describe how to walk it.
pub fn plan_view(
    offset: u64,
    size: &[u64],
    stride: &[u64],
    capacity: u64,
) -> std::result::Result<ViewPlan, String> {
    if size.len() != stride.len() {
        return Err("size and stride have different lengths".into());
    }
    let numel = size
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or("element count overflows")?;
    if numel == 0 {
        if offset > capacity {
            return Err(format!(
                "view offset {offset} is past the end of its storage ({capacity} elements)"
            ));
        }
        return Ok(ViewPlan {
            numel: 0,
            first: offset,
            span: 0,
            dims: Vec::new(),
        });
    }
    let mut last = offset;
    for (&s, &st) in size.iter().zip(stride) {
        last = (s - 1)
            .checked_mul(st)
            .and_then(|x| last.checked_add(x))
            .ok_or("view extent overflows")?;
    }
    if last >= capacity {
        return Err(format!(
            "tensor view (offset {offset}, size {size:?}, stride {stride:?}) reaches element \
             {last}, past the end of its storage ({capacity} elements)"
        ));
    }
    if numel > capacity && numel > MAX_OVERLAP_NUMEL {
        return Err(format!(
            "tensor view has {numel} elements over a storage of {capacity} (overlapping \
             strides); refusing the work"
        ));
    }
    let mut dims: Vec<(u64, u64)> = Vec::with_capacity(size.len());
    for (&s, &st) in size.iter().zip(stride) {
        if s == 1 {
            continue;
        }
        match dims.last_mut() {
            // The previous (outer) dim steps exactly over this one: merge.
            Some(outer) if outer.1 == st.saturating_mul(s) => {
                *outer = (outer.0 * s, st);
            }
            _ => dims.push((s, st)),
        }
    }
    Ok(ViewPlan {
        numel,
        first: offset,
        span: last - offset + 1,
        dims,
    })
}

/// Reduce the elements of `plan` from `bytes`, which start at element
/// `plan.first` and hold `plan.span` elements.
pub fn reduce_planned(
    bytes: &[u8],
    kind: FloatKind,
    plan: &ViewPlan,
) -> std::result::Result<Reduction, String> {
    let es = kind.size();
    let need = usize::try_from(plan.span)
        .ok()
        .and_then(|s| s.checked_mul(es))
        .ok_or("view too large")?;
    let bytes = bytes
        .get(..need)
        .ok_or("storage bytes shorter than the view")?;
    let mut out = Reduction {
        numel: plan.numel,
        ..Reduction::default()
    };
    let Some((&(inner_n, inner_stride), outer)) = plan.dims.split_last() else {
        // A scalar (all dims of size 1).
        let (s, nf) = reduce_run(bytes.get(..es).unwrap_or_default(), kind);
        out.sum = s;
        out.nonfinite = nf;
        return Ok(out);
    };
    let run_len = usize::try_from(inner_n).map_err(|_| "view too large")?;
    let inner_stride = usize::try_from(inner_stride).map_err(|_| "view too large")?;
    let mut index = vec![0u64; outer.len()];
    loop {
        let base: u64 = index.iter().zip(outer).map(|(i, d)| i * d.1).sum();
        let start = usize::try_from(base).map_err(|_| "view too large")? * es;
        let (s, nf) = if inner_stride == 1 {
            let run = bytes
                .get(start..start + run_len * es)
                .ok_or("view outside the storage bytes")?;
            reduce_run(run, kind)
        } else {
            reduce_strided(bytes, start, run_len, inner_stride * es, kind)
                .ok_or("view outside the storage bytes")?
        };
        out.sum += s;
        out.nonfinite += nf;
        // Odometer over the outer dims, innermost fastest.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            index[d] += 1;
            if index[d] < outer[d].0 {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Sum a contiguous run with 8 independent f64 accumulators (vectorizable).
#[inline(always)]
fn sum_contig<const N: usize>(bytes: &[u8], dec: impl Fn([u8; N]) -> (f64, bool)) -> (f64, u64) {
    const LANES: usize = 8;
    let mut acc = [0.0f64; LANES];
    let mut bad = [0u64; LANES];
    let mut blocks = bytes.chunks_exact(N * LANES);
    for block in &mut blocks {
        for ((a, b), c) in acc
            .iter_mut()
            .zip(bad.iter_mut())
            .zip(block.chunks_exact(N))
        {
            let (v, nf) = dec(<[u8; N]>::try_from(c).unwrap_or([0; N]));
            *a += v;
            *b += u64::from(nf);
        }
    }
    for (i, c) in blocks.remainder().chunks_exact(N).enumerate() {
        let (v, nf) = dec(<[u8; N]>::try_from(c).unwrap_or([0; N]));
        acc[i % LANES] += v;
        bad[i % LANES] += u64::from(nf);
    }
    let sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    (sum, bad.iter().sum())
}

fn reduce_run(bytes: &[u8], kind: FloatKind) -> (f64, u64) {
    match kind {
        FloatKind::F32 => sum_contig::<4>(bytes, dec_f32),
        FloatKind::F64 => sum_contig::<8>(bytes, dec_f64),
        FloatKind::F16 => sum_f16(bytes),
        FloatKind::BF16 => sum_contig::<2>(bytes, dec_bf16),
    }
}

/// Half floats in two passes per block: decode 64 values to f32 (a simple
/// loop the compiler vectorizes), then sum them as f32 runs do.
fn sum_f16(bytes: &[u8]) -> (f64, u64) {
    const BLOCK: usize = 64;
    let mut sum = 0.0f64;
    let mut bad = 0u64;
    let mut blocks = bytes.chunks_exact(2 * BLOCK);
    let mut tmp = [0.0f32; BLOCK];
    for block in &mut blocks {
        let mut nb = 0u32;
        for (t, c) in tmp.iter_mut().zip(block.chunks_exact(2)) {
            let h = u16::from_le_bytes(<[u8; 2]>::try_from(c).unwrap_or([0; 2]));
            *t = f16_to_f32(h);
            nb += u32::from(h & 0x7c00 == 0x7c00);
        }
        let mut acc = [0.0f64; 8];
        for lane in tmp.chunks_exact(8) {
            for (a, v) in acc.iter_mut().zip(lane) {
                *a += f64::from(*v);
            }
        }
        sum += ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        bad += u64::from(nb);
    }
    let (s, b) = sum_contig::<2>(blocks.remainder(), dec_f16);
    (sum + s, bad + b)
}

fn gather<const N: usize>(
    bytes: &[u8],
    start: usize,
    n: usize,
    step: usize,
    dec: impl Fn([u8; N]) -> (f64, bool),
) -> Option<(f64, u64)> {
    let mut acc = [0.0f64; 4];
    let mut bad = 0u64;
    for i in 0..n {
        let at = start.checked_add(i.checked_mul(step)?)?;
        let c = bytes.get(at..at.checked_add(N)?)?;
        let (v, nf) = dec(<[u8; N]>::try_from(c).ok()?);
        acc[i % 4] += v;
        bad += u64::from(nf);
    }
    Some(((acc[0] + acc[2]) + (acc[1] + acc[3]), bad))
}

fn reduce_strided(
    bytes: &[u8],
    start: usize,
    n: usize,
    step: usize,
    kind: FloatKind,
) -> Option<(f64, u64)> {
    match kind {
        FloatKind::F32 => gather::<4>(bytes, start, n, step, dec_f32),
        FloatKind::F64 => gather::<8>(bytes, start, n, step, dec_f64),
        FloatKind::F16 => gather::<2>(bytes, start, n, step, dec_f16),
        FloatKind::BF16 => gather::<2>(bytes, start, n, step, dec_bf16),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Reference: decode every element the slow obvious way.
    fn naive(
        bytes: &[u8],
        kind: FloatKind,
        offset: u64,
        size: &[u64],
        stride: &[u64],
    ) -> (f64, u64) {
        let es = kind.size();
        let numel: u64 = size.iter().product();
        let mut sum = 0.0;
        let mut bad = 0;
        for flat in 0..numel {
            let mut rem = flat;
            let mut idx = offset;
            for d in (0..size.len()).rev() {
                idx += (rem % size[d]) * stride[d];
                rem /= size[d];
            }
            let at = idx as usize * es;
            let c = &bytes[at..at + es];
            let v = match kind {
                FloatKind::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap())),
                FloatKind::F64 => f64::from_le_bytes(c.try_into().unwrap()),
                FloatKind::BF16 => f64::from(f32::from_bits(
                    u32::from(u16::from_le_bytes(c.try_into().unwrap())) << 16,
                )),
                FloatKind::F16 => half_reference(u16::from_le_bytes(c.try_into().unwrap())),
            };
            if !v.is_finite() {
                bad += 1;
            }
            sum += v;
        }
        (sum, bad)
    }

    /// IEEE half by the textbook formula.
    fn half_reference(h: u16) -> f64 {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((h >> 10) & 0x1f);
        let m = f64::from(h & 0x3ff);
        match e {
            0 => sign * m * 2f64.powi(-24),
            31 if m == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn f16_decode_matches_formula_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let got = f64::from(f16_to_f32(h));
            let want = half_reference(h);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
            assert_eq!(dec_f16(h.to_le_bytes()).1, !want.is_finite(), "{h:#06x}");
        }
    }

    fn bytes_of(kind: FloatKind, vals: &[f64]) -> Vec<u8> {
        let mut out = Vec::new();
        for &v in vals {
            match kind {
                FloatKind::F32 => out.extend((v as f32).to_le_bytes()),
                FloatKind::F64 => out.extend(v.to_le_bytes()),
                FloatKind::BF16 => out.extend((((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
                // Only values exactly representable are used with f16 here.
                FloatKind::F16 => {
                    let h = (0..=u16::MAX)
                        .find(|&h| {
                            half_reference(h) == v || (v.is_nan() && half_reference(h).is_nan())
                        })
                        .unwrap();
                    out.extend(h.to_le_bytes());
                }
            }
        }
        out
    }

    fn check_view(kind: FloatKind, vals: &[f64], offset: u64, size: &[u64], stride: &[u64]) {
        let bytes = bytes_of(kind, vals);
        let plan = plan_view(offset, size, stride, vals.len() as u64).unwrap();
        let es = kind.size();
        let span = &bytes[plan.first as usize * es..(plan.first + plan.span) as usize * es];
        let got = reduce_planned(span, kind, &plan).unwrap();
        let (sum, bad) = naive(&bytes, kind, offset, size, stride);
        assert_eq!(got.numel, size.iter().product::<u64>());
        assert_eq!(got.nonfinite, bad);
        assert!(
            (got.sum - sum).abs() <= 1e-12 * sum.abs().max(1.0)
                || (got.sum.is_nan() && sum.is_nan()),
            "{kind:?} {size:?} {stride:?}: {} vs {sum}",
            got.sum
        );
    }

    #[test]
    fn views_match_naive_walk() {
        let vals: Vec<f64> = (0..240).map(|i| f64::from(i % 17) * 0.25 + 0.5).collect();
        for kind in [
            FloatKind::F32,
            FloatKind::F64,
            FloatKind::F16,
            FloatKind::BF16,
        ] {
            check_view(kind, &vals, 0, &[240], &[1]);
            check_view(kind, &vals, 3, &[7, 5], &[5, 1]);
            check_view(kind, &vals, 0, &[12, 20], &[1, 12]); // transposed
            check_view(kind, &vals, 10, &[4, 3, 5], &[40, 1, 6]);
            check_view(kind, &vals, 5, &[3, 1, 4], &[8, 99, 2]); // size-1 dim with odd stride
            check_view(kind, &vals, 7, &[], &[]); // scalar
            check_view(kind, &vals, 0, &[3, 4], &[0, 1]); // broadcast
            check_view(kind, &vals, 0, &[37], &[1]); // remainder handling
        }
    }

    #[test]
    fn nonfinite_counted_and_nan_propagates() {
        let vals = [
            1.0,
            f64::NAN,
            2.0,
            f64::INFINITY,
            3.0,
            4.0,
            5.0,
            6.0,
            7.0,
            -f64::INFINITY,
        ];
        for kind in [
            FloatKind::F32,
            FloatKind::F64,
            FloatKind::F16,
            FloatKind::BF16,
        ] {
            let bytes = bytes_of(kind, &vals);
            let plan = plan_view(0, &[10], &[1], 10).unwrap();
            let r = reduce_planned(&bytes, kind, &plan).unwrap();
            assert_eq!(r.nonfinite, 3, "{kind:?}");
            assert!(r.mean().is_nan());
        }
        let plan = plan_view(0, &[2], &[1], 2).unwrap();
        let r = reduce_planned(
            &bytes_of(FloatKind::F32, &[1.0, f64::INFINITY]),
            FloatKind::F32,
            &plan,
        )
        .unwrap();
        assert_eq!(r.mean(), f64::INFINITY);
    }

    #[test]
    fn views_past_the_storage_are_refused() {
        assert!(plan_view(0, &[10], &[1], 10).is_ok());
        assert!(plan_view(1, &[10], &[1], 10).is_err());
        assert!(plan_view(0, &[4, 3], &[3, 1], 11).is_err());
        assert!(plan_view(0, &[3, 4], &[1, 3], 12).is_ok());
        assert!(plan_view(0, &[u64::MAX, 2], &[1, 1], 10).is_err());
        assert!(plan_view(0, &[2], &[u64::MAX], 10).is_err());
        assert!(plan_view(11, &[0], &[1], 10).is_err());
        assert_eq!(plan_view(10, &[0, 5], &[5, 1], 10).unwrap().numel, 0);
        assert!(plan_view(0, &[1 << 30], &[0], 1).is_err());
        assert!(Reduction::default().mean().is_nan());
    }

    #[test]
    fn contiguous_dims_merge() {
        let plan = plan_view(6, &[2, 3, 4], &[12, 4, 1], 30).unwrap();
        assert_eq!(plan.dims, vec![(24, 1)]);
        assert_eq!(plan.span, 24);
    }

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
