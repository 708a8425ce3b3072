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
pub mod same_run;

use std::ffi::OsString;

use rayon::prelude::*;

use crate::io::confine;
use crate::store::layout::Target;
use crate::store::probe_inputs::{gather, Wanted};
use crate::verdicts::drift::DriftOptions;
use crate::verdicts::full_weights::FullWeightsOptions;
use crate::verdicts::gap::GapOptions;
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
    pub gap: Option<GapOptions>,
}

impl ScanOptions {
    /// The inputs these probes need.
    pub fn wanted(&self) -> Wanted {
        Wanted {
            drift: self.drift.is_some(),
            ghost: self.ghost.is_some(),
            weights: self.weights.is_some(),
            full_weights: self.full_weights.is_some(),
            gap: self.gap.is_some(),
        }
    }
}

/// One probe's verdict on one store (`adapter` None) or adapter version.
///
/// Paths are kept as the text Python shows (`str(pathlib.Path(p))`, see
/// `io::path_text`); `json` is the record's JSON object when asked for.
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
            let mut records = guarded(t, options, || {
                let root = t.root.clone().map(std::sync::Arc::new);
                let inputs = confine::within(root, || gather(t, wanted));
                assemble::records_for(&inputs, options)
            });
            if json {
                for r in &mut records {
                    r.json = Some(json::record_json(r));
                }
            }
            records
        })
        .collect();
    let mut records: Vec<Record> = per_target.into_iter().flatten().collect();
    same_run::fold_tracker_runs(&mut records, json);
    records
}

/// The records `make` returns for target `t`; should it panic (a bug: no
/// reader or rule is meant to), one `error` record per probe asked for,
/// naming what failed, so one store can never stop a scan.
fn guarded(t: &Target, options: &ScanOptions, make: impl FnOnce() -> Vec<Record>) -> Vec<Record> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(make)) {
        Ok(records) => records,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "an internal error".to_string());
            let kinds = [
                (options.drift.is_some(), crate::verdicts::drift::KIND),
                (options.weights.is_some(), crate::verdicts::weights::KIND),
                (
                    options.full_weights.is_some(),
                    crate::verdicts::full_weights::KIND,
                ),
                (options.ghost.is_some(), crate::verdicts::ghost::KIND),
                (options.gap.is_some(), crate::verdicts::gap::KIND),
            ];
            kinds
                .into_iter()
                .filter(|(asked, _)| *asked)
                .map(|(_, kind)| Record {
                    store: crate::io::path_text::python_path(&t.store),
                    adapter: None,
                    layout: t.layout.clone(),
                    checkpoint_kind: t.checkpoint_kind.clone(),
                    judged: Judged::bare(
                        kind,
                        crate::verdicts::Verdict::Error,
                        format!(
                            "{kind} failed while judging this store: {} (a bug in \
                             adapterprobe; please report it)",
                            crate::io::excerpt::excerpt(&why)
                        ),
                    ),
                    json: None,
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::panic)]
    fn a_panic_while_judging_becomes_error_records_for_that_store_only() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Target {
            store: tmp.path().join("store"),
            layout: "dlm".to_string(),
            versions: vec![],
            broken: vec![],
            with_logs: true,
            log_root: None,
            checkpoint_kind: None,
            root: None,
        };
        let options = ScanOptions {
            drift: Some(crate::verdicts::drift::DriftOptions::defaults("robust")),
            ..ScanOptions::default()
        };
        let out = guarded(&t, &options, || panic!("index out of bounds"));
        assert_eq!(out.len(), 1);
        let j = &out[0].judged;
        assert_eq!(j.verdict, crate::verdicts::Verdict::Error);
        assert_eq!(j.kind, "training_drift");
        assert!(j.message.contains("index out of bounds"), "{}", j.message);
        assert!(guarded(&t, &options, Vec::new).is_empty());
    }
}
