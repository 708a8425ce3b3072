//! Scan records: each target gathered, judged and turned into its records
//! in one parallel pass, with each record's JSON text written there too.
//!
//! A scan's cost per store used to be mostly Python building results and
//! records while the Rust gather waited; here the whole per-store work runs
//! on the rayon pool, GIL-free, and Python receives finished records (see
//! `py/records.rs`). Record order and fields are those of the Python
//! `ScanRecord` (see `assemble`), and the JSON text is byte for byte what
//! `ScanRecord.to_json` writes (see `json`).
//!
//! Room order: the top room, above `verdicts` and `store`.

pub mod assemble;
pub mod json;
pub mod path_text;

use std::ffi::OsString;

use rayon::prelude::*;

use crate::io::confine;
use crate::store::layout::Target;
use crate::store::probe_inputs::{gather, Wanted};
use crate::verdicts::drift::DriftOptions;
use crate::verdicts::full_weights::FullWeightsOptions;
use crate::verdicts::ghost::GhostOptions;
use crate::verdicts::weights::WeightsOptions;
use crate::verdicts::Judged;

/// Which probes a scan runs, each with its resolved options.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    pub drift: Option<DriftOptions>,
    pub ghost: Option<GhostOptions>,
    pub weights: Option<WeightsOptions>,
    pub full_weights: Option<FullWeightsOptions>,
}

impl ScanOptions {
    /// The inputs these probes need.
    pub fn wanted(&self) -> Wanted {
        Wanted {
            drift: self.drift.is_some(),
            ghost: self.ghost.is_some(),
            weights: self.weights.is_some(),
            full_weights: self.full_weights.is_some(),
        }
    }
}

/// One probe's verdict on one store (`adapter` None) or adapter version.
///
/// Paths are kept as the text Python shows (`str(pathlib.Path(p))`, see
/// `path_text`); `json` is the record's JSON object when asked for.
#[derive(Debug, Clone)]
pub struct Record {
    pub store: OsString,
    pub adapter: Option<OsString>,
    pub layout: String,
    pub checkpoint_kind: Option<String>,
    pub judged: Judged,
    pub json: Option<String>,
}

/// Gather, judge and assemble the records of `targets` in parallel (on the
/// current rayon pool), in target order; with `json`, each record's JSON
/// text is written in the same pass.
pub fn scan_records(targets: &[Target], options: &ScanOptions, json: bool) -> Vec<Record> {
    let wanted = options.wanted();
    let per_target: Vec<Vec<Record>> = targets
        .par_iter()
        .map(|t| {
            let root = t.root.clone().map(std::sync::Arc::new);
            let inputs = confine::within(root, || gather(t, wanted));
            let mut records = assemble::records_for(&inputs, options);
            if json {
                for r in &mut records {
                    r.json = Some(json::record_json(r));
                }
            }
            records
        })
        .collect();
    per_target.into_iter().flatten().collect()
}
