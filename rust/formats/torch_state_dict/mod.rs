//! A state dict saved with `torch.save` (PEFT's `adapter_model.bin`), read
//! as a list of named tensors at byte spans of the file, so the streaming
//! reader written for safetensors ([`SafetensorsData`]) reads it unchanged.
//!
//! Why this works without copying or unpickling tensors: `torch.save`
//! stores every storage as an uncompressed zip entry, so a contiguous
//! tensor view is one run of bytes of the file, exactly what a safetensors
//! header entry describes. The pickle is run by the allow-listed
//! interpreter with unknown globals refused (nothing is imported or
//! called); its top-level value must be a dict of string keys to tensors,
//! and anything else in it is an error that names the key.
//!
//! Each view is checked against its storage entry (the entry exists, is as
//! large as the pickle claims, and holds the view) before it becomes a
//! span, the entry's data must lie inside the file, and the elements of all
//! views are charged to the archive's [`WorkBudget`]: tensors may share a
//! storage (tied weights), so spans may overlap, but never add up to far
//! more than the file holds. A legacy (pre-1.6, not zip) `torch.save` file
//! is recognised by its magic number and refused by name.

use std::io::Read;
use std::path::Path;

use crate::error::{Area, Error, Result};
use crate::formats::pickle::{UnknownGlobals, Value};
use crate::formats::safetensors_header::{read_header, Header, TensorInfo};
use crate::formats::tensor_data::{FloatKind, SafetensorsData};
use crate::formats::torch_save::{TorchSave, WorkBudget};
use crate::io::files::open_ranged;
use crate::io::staged;

/// What a legacy `torch.save` file starts with: protocol 2, then the pickled
/// magic number 0x1950a86a20f9469cfc6c (a `LONG1` of 10 bytes).
const LEGACY_MAGIC: [u8; 14] = [
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

/// Whether `path` names a `torch.save` file by its extension (`.bin`,
/// `.pt`, `.pth`) rather than a safetensors one.
pub fn is_torch_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e, "bin" | "pt" | "pth"))
}

/// Open a file of named float tensors: a `torch.save` state dict when its
/// extension says so ([`is_torch_file`]), else a safetensors file.
pub fn open_tensor_file(path: &Path) -> Result<SafetensorsData> {
    if is_torch_file(path) {
        open_state_dict(path)
    } else {
        SafetensorsData::open(path)
    }
}

/// The tensor names, dtypes and shapes of a file [`open_tensor_file`]
/// reads: the safetensors header alone, or the state dict's pickle.
pub fn read_tensor_header(path: &Path) -> Result<Header> {
    if is_torch_file(path) {
        open_state_dict(path).map(|data| data.header().clone())
    } else {
        read_header(path)
    }
}

/// Open the `torch.save` state dict at `path` for streaming reads. Errors
/// are `Area::Weights`, except a global outside the allow-list
/// (`Area::UnsafePickle`) and a missing file (`Area::Missing`).
pub fn open_state_dict(path: &Path) -> Result<SafetensorsData> {
    refuse_legacy(path)?;
    let save = TorchSave::open(path, UnknownGlobals::Refuse).map_err(as_weights)?;
    let mut budget = WorkBudget::for_archive(&save.archive);
    let tensors = tensor_spans(&save, &mut budget).map_err(as_weights)?;
    SafetensorsData::from_spans(path, tensors)
}

/// Errors of the archive and pickle readers (`TrainingState`, which names
/// optimizer state) restated as what they are here: unreadable weights.
fn as_weights(mut e: Error) -> Error {
    if e.area == Area::TrainingState {
        e.area = Area::Weights;
    }
    e
}

/// Refuse a legacy (pre-1.6) `torch.save` file by name: it is a bare
/// pickle stream with storages appended, which this reader does not read.
fn refuse_legacy(path: &Path) -> Result<()> {
    let file = open_ranged(path, Area::Weights)?;
    staged::fill(path, Area::Weights, 0, LEGACY_MAGIC.len() as u64)?;
    let mut head = Vec::with_capacity(LEGACY_MAGIC.len());
    file.take(LEGACY_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(Area::Weights, path, &e))?;
    if head == LEGACY_MAGIC {
        return Err(Error::new(
            Area::Weights,
            path,
            "this is torch's legacy (pre-1.6, not zip) torch.save format, which is not read; \
             save the adapter again with a current torch, or with safetensors",
        ));
    }
    Ok(())
}

/// The tensors of the state dict, sorted by name (the order a safetensors
/// header lists them in, so both formats report alike), each with the
/// absolute byte span of the file it occupies. Every view's elements are
/// charged to `budget`.
fn tensor_spans(save: &TorchSave, budget: &mut WorkBudget) -> Result<Vec<TensorInfo>> {
    let graph = &save.graph;
    let entries = graph.dict_entries(graph.root).ok_or_else(|| {
        save.err(format!(
            "the pickle holds a {}, not a state dict (a dict of tensor names to tensors)",
            graph.get(graph.root).kind()
        ))
    })?;
    let mut tensors = Vec::with_capacity(entries.len());
    for &(key, value) in entries {
        let name = graph.str_of(key).ok_or_else(|| {
            save.err(format!(
                "the state dict has a {} key; tensor names are strings",
                graph.get(key).kind()
            ))
        })?;
        let Value::Tensor(t) = graph.get(value) else {
            return Err(save.err(format!(
                "state dict entry {:?} is a {}, not a tensor",
                clip(name),
                graph.get(value).kind()
            )));
        };
        let what = format!("tensor {:?}", clip(name));
        let view = save.view(t, &what)?;
        let contiguous = match view.plan.dims.as_slice() {
            [] => true,
            [(_, stride)] => *stride == 1,
            _ => false,
        };
        if !contiguous {
            return Err(save.err(format!(
                "{what} is not contiguous (size {:?}, stride {:?}); only contiguous tensors \
                 are read",
                t.size, t.stride
            )));
        }
        if !budget.charge(view.plan.numel) {
            return Err(save.over_budget(&what));
        }
        let entry_start = save.archive.data_offset(&view.entry_name, view.entry)?;
        let span = view
            .plan
            .first
            .checked_mul(view.elem_size)
            .and_then(|skip| entry_start.checked_add(skip))
            .and_then(|start| {
                let len = view.plan.numel.checked_mul(view.elem_size)?;
                Some((start, start.checked_add(len)?))
            })
            .ok_or_else(|| save.err(format!("{what}: its byte span overflows")))?;
        let dtype = FloatKind::of(t.dtype).map_or(t.dtype.name, FloatKind::safetensors_name);
        tensors.push(TensorInfo {
            name: name.to_owned(),
            dtype: dtype.to_owned(),
            shape: t.size.clone(),
            data_offsets: span,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = tensors.windows(2).find(|p| p[0].name == p[1].name) {
        return Err(save.err(format!(
            "the state dict names tensor {:?} twice",
            clip(&pair[0].name)
        )));
    }
    Ok(tensors)
}

/// At most 200 characters of a name a file chose, for messages.
fn clip(s: &str) -> &str {
    s.char_indices().nth(200).map_or(s, |(i, _)| &s[..i])
}

#[cfg(test)]
mod tests;
