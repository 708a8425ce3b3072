//! One `torch.save` file opened for reading: the zip archive, its
//! `<prefix>/`, the object graph from the allow-listed pickle interpreter,
//! and bounded reads of the storages its tensors view.
//!
//! Every optimizer-state reader (dlm, HF Trainer, Lightning) starts here,
//! so the archive checks, the pickle caps and the rule that a tensor view
//! is checked against its storage entry before a byte is read live in one
//! place.

use std::path::Path;

use crate::error::{Error, Result};
use crate::formats::pickle::{self, Tensor, UnknownGlobals, Unpickled};
use crate::formats::tensor_data::{f16_to_f32, FloatKind};
use crate::formats::tensor_view::{plan_view, ViewPlan};
use crate::io::zip_archive::{Archive, Entry};

/// A `torch.save` archive and its unpickled payload.
pub struct TorchSave {
    pub archive: Archive,
    /// The archive's top folder (`archive`, `optimizer`, `training_state`...).
    pub prefix: String,
    pub graph: Unpickled,
}

/// Largest storage span read into memory at once; bigger views stream.
pub const STREAM_CHUNK_BYTES: u64 = 8 << 20;

/// Elements of tensor data a file may make us read in total. A legitimate
/// file reads each storage about once, so views that add up to far more
/// than the file holds (shared or overlapping) are an amplification
/// attack, not data.
pub struct WorkBudget {
    left: u64,
}

impl WorkBudget {
    /// The budget for one archive: twice its size plus 64 Mi elements.
    pub fn for_archive(archive: &Archive) -> WorkBudget {
        WorkBudget {
            left: archive.len.saturating_mul(2).saturating_add(1 << 26),
        }
    }

    /// A budget of `elements` (tests use small ones).
    #[cfg(test)]
    pub(crate) fn of_elements(elements: u64) -> WorkBudget {
        WorkBudget { left: elements }
    }

    /// Take `elements` from the budget; false when it is spent.
    pub fn charge(&mut self, elements: u64) -> bool {
        match self.left.checked_sub(elements) {
            Some(left) => {
                self.left = left;
                true
            }
            None => false,
        }
    }
}

/// Where a validated tensor view's bytes are.
pub struct ViewBytes<'a> {
    pub entry_name: String,
    pub entry: &'a Entry,
    pub plan: ViewPlan,
    /// Bytes per element of the tensor's dtype.
    pub elem_size: u64,
}

impl TorchSave {
    /// Open `file` and unpickle its `data.pkl`, treating globals outside
    /// the allow-list as `unknown` says.
    pub fn open(file: &Path, unknown: UnknownGlobals) -> Result<TorchSave> {
        let archive = Archive::open(file)?;
        let prefix = single_prefix(&archive)?;
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
        let graph = pickle::unpickle_with_policy(&buf, limits, unknown).map_err(|e| {
            let err = Error::new(e.area, file, format!("{pkl_name}: {e}"));
            match e.global {
                Some(global) => err.with("global_name", global),
                None => err,
            }
        })?;
        Ok(TorchSave {
            archive,
            prefix,
            graph,
        })
    }

    pub fn err(&self, message: impl Into<String>) -> Error {
        self.archive.err(message)
    }

    pub fn path(&self) -> &Path {
        &self.archive.path
    }

    /// Check the view `t` against its storage entry: the entry exists and
    /// is as large as the pickle claims, and the view lies inside it.
    /// `what` names the tensor in messages.
    pub fn view(&self, t: &Tensor, what: &str) -> Result<ViewBytes<'_>> {
        let key = self
            .graph
            .str_of(t.storage.key)
            .ok_or_else(|| self.err(format!("{what}: storage key is not a string")))?;
        let entry_name = format!("{}/data/{key}", self.prefix);
        let entry = self.archive.entry(&entry_name).ok_or_else(|| {
            self.err(format!(
                "{what}: storage '{key}' is missing from the archive (no entry {entry_name})"
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
        let elem_size = t.dtype.size as u64;
        if elem_size == 0 {
            return Err(self.err(format!("{what}: dtype {} has no size", t.dtype.name)));
        }
        let plan = plan_view(t.offset, &t.size, &t.stride, claimed / elem_size)
            .map_err(|m| self.err(format!("{what}: {m}")))?;
        Ok(ViewBytes {
            entry_name,
            entry,
            plan,
            elem_size,
        })
    }

    /// The value of the one-element tensor `t` (a 0-d `step`), for float
    /// and integer dtypes.
    pub fn scalar(&self, t: &Tensor, what: &str, scratch: &mut Vec<u8>) -> Result<f64> {
        let v = self.view(t, what)?;
        if v.plan.numel != 1 {
            return Err(self.err(format!(
                "{what} has {} elements, expected one (shape {:?})",
                v.plan.numel, t.size
            )));
        }
        self.archive.read_entry_range(
            &v.entry_name,
            v.entry,
            v.plan.first * v.elem_size,
            v.elem_size,
            scratch,
        )?;
        decode_scalar(t.dtype.name, scratch)
            .ok_or_else(|| self.err(format!("{what} has dtype {}, not a number", t.dtype.name)))
    }

    /// Check that `t` is a contiguous view (elements in storage order, as
    /// blockwise-quantized states must be) and charge its elements to the
    /// budget; read it with [`TorchSave::read_elems`].
    pub fn contiguous(
        &self,
        t: &Tensor,
        what: &str,
        budget: &mut WorkBudget,
    ) -> Result<ViewBytes<'_>> {
        let v = self.view(t, what)?;
        let contiguous = match v.plan.dims.as_slice() {
            [] => true,
            [(_, stride)] => *stride == 1,
            _ => false,
        };
        if !contiguous {
            return Err(self.err(format!(
                "{what} is not a contiguous tensor (size {:?}, stride {:?}); only contiguous \
                 states are read",
                t.size, t.stride
            )));
        }
        if !budget.charge(v.plan.numel) {
            return Err(self.over_budget(what));
        }
        Ok(v)
    }

    /// Read elements `start..start + count` of the contiguous view `v`
    /// into `scratch` (which is cleared first).
    pub fn read_elems(
        &self,
        v: &ViewBytes<'_>,
        start: u64,
        count: u64,
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        let in_view = start
            .checked_add(count)
            .is_some_and(|end| end <= v.plan.numel);
        if !in_view {
            return Err(self.err(format!(
                "read of elements {start}..+{count} past the end of {} ({} elements)",
                v.entry_name, v.plan.numel
            )));
        }
        self.archive.read_entry_range(
            &v.entry_name,
            v.entry,
            (v.plan.first + start) * v.elem_size,
            count * v.elem_size,
            scratch,
        )
    }

    /// The error for a file whose views add up to more work than its budget.
    pub fn over_budget(&self, what: &str) -> Error {
        self.err(format!(
            "{what}: the tensors read add up to far more data than the file holds (shared \
             or overlapping views); refusing the work"
        ))
    }
}

/// The float kind of `t`, or why it has none.
pub fn float_kind(t: &Tensor, what: &str) -> std::result::Result<FloatKind, String> {
    FloatKind::of(t.dtype).ok_or_else(|| {
        format!(
            "{what} has dtype {}; only float32, float16, bfloat16 and float64 are read",
            t.dtype.name
        )
    })
}

/// The one prefix `<p>/data.pkl` of a torch.save archive.
fn single_prefix(archive: &Archive) -> Result<String> {
    let mut prefixes: Vec<&str> = archive
        .entries
        .keys()
        .filter_map(|n| n.strip_suffix("/data.pkl"))
        .filter(|p| !p.is_empty() && !p.contains('/'))
        .collect();
    prefixes.sort_unstable();
    match prefixes.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err(archive
            .err("zip archive has no <prefix>/data.pkl entry, so it is not a torch.save file")),
        many => Err(archive.err(format!(
            "zip archive has {} data.pkl entries ({}); refusing to guess",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// A little-endian element of the torch dtype `dtype` as f64.
fn decode_scalar(dtype: &str, bytes: &[u8]) -> Option<f64> {
    fn le<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
        bytes.get(..N)?.try_into().ok()
    }
    let value = match dtype {
        "float32" => f64::from(f32::from_le_bytes(le(bytes)?)),
        "float64" => f64::from_le_bytes(le(bytes)?),
        "float16" => f64::from(f16_to_f32(u16::from_le_bytes(le(bytes)?))),
        "bfloat16" => f64::from(f32::from_bits(
            u32::from(u16::from_le_bytes(le(bytes)?)) << 16,
        )),
        "int64" => i64::from_le_bytes(le(bytes)?) as f64,
        "int32" => f64::from(i32::from_le_bytes(le(bytes)?)),
        "int16" => f64::from(i16::from_le_bytes(le(bytes)?)),
        "int8" => f64::from(i8::from_le_bytes(le(bytes)?)),
        "uint8" => f64::from(*bytes.first()?),
        _ => return None,
    };
    Some(value)
}

/// Helpers for tests that build or mutate torch.save archives.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};

    use crate::io::zip_archive::Archive;

    /// A zip of `entries` with compression `method` (0 = STORED, as
    /// torch.save writes), sizes claimed truthfully.
    pub fn zip_bytes(entries: &[(&str, &[u8])], method: u16) -> Vec<u8> {
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

    /// Copy the torch.save file `src` to `dir/name` with its `data.pkl`
    /// changed by `edit`; every other entry is kept byte for byte.
    pub fn with_edited_pickle(
        src: &Path,
        dir: &Path,
        name: &str,
        edit: impl FnOnce(&mut Vec<u8>),
    ) -> PathBuf {
        let mut edit = Some(edit);
        let archive = Archive::open(src).unwrap();
        let mut names: Vec<&String> = archive.entries.keys().collect();
        names.sort();
        let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
        for n in names {
            let e = archive.entry(n).unwrap();
            let mut buf = Vec::new();
            archive.read_entry_range(n, e, 0, e.size, &mut buf).unwrap();
            if n.ends_with("/data.pkl") {
                (edit.take().unwrap())(&mut buf);
            }
            entries.push((n.clone(), buf));
        }
        let refs: Vec<(&str, &[u8])> = entries
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        let path = dir.join(name);
        std::fs::write(&path, zip_bytes(&refs, 0)).unwrap();
        path
    }

    /// Opcodes that run just before the final STOP, with the payload's root
    /// dict on top of the stack (so `key value s` overrides a field).
    pub fn insert_before_stop(pkl: &mut Vec<u8>, ops: &[u8]) {
        assert_eq!(pkl.last(), Some(&b'.'));
        let at = pkl.len() - 1;
        pkl.splice(at..at, ops.iter().copied());
    }

    /// BINUNICODE of `s`.
    pub fn text(s: &str) -> Vec<u8> {
        let mut out = vec![b'X'];
        out.extend((s.len() as u32).to_le_bytes());
        out.extend(s.as_bytes());
        out
    }

    /// Replace the first `from` after the first `anchor` by `to` (same
    /// length); panics when either is absent, so a changed fixture fails
    /// the test loudly.
    pub fn replace_after(pkl: &mut [u8], anchor: &[u8], from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len());
        let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
        let a = find(pkl, anchor).expect("anchor in pickle");
        let f = a + find(&pkl[a..], from).expect("pattern after anchor");
        pkl[f..f + to.len()].copy_from_slice(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_of_every_step_dtype() {
        assert_eq!(decode_scalar("float32", &3f32.to_le_bytes()), Some(3.0));
        assert_eq!(decode_scalar("float64", &7f64.to_le_bytes()), Some(7.0));
        assert_eq!(decode_scalar("float16", &[0x00, 0x42]), Some(3.0));
        assert_eq!(decode_scalar("bfloat16", &[0x40, 0x40]), Some(3.0));
        assert_eq!(decode_scalar("int64", &(-5i64).to_le_bytes()), Some(-5.0));
        assert_eq!(decode_scalar("int32", &9i32.to_le_bytes()), Some(9.0));
        assert_eq!(decode_scalar("uint8", &[200]), Some(200.0));
        assert_eq!(decode_scalar("float32", &[0, 0]), None);
        assert_eq!(decode_scalar("complex64", &[0; 8]), None);
    }

    #[test]
    fn budget_runs_out() {
        let mut b = WorkBudget { left: 10 };
        assert!(b.charge(6));
        assert!(!b.charge(5));
        assert!(b.charge(4));
        assert!(!b.charge(1));
    }
}
