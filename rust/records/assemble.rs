//! One target's records, in the order a report lists them: the store's own
//! records first, by probe name (`gap_monitor`, when its logs hold the GAP
//! monitor's records, then `training_drift`), then each version's records in the
//! store's version order (checkpoint-40 before checkpoint-120), each
//! version's probes by name; a directory the walk could not enter is one
//! `discovery` record instead.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::io::path_text::python_path;
use crate::records::{Record, ScanOptions};
use crate::store::probe_inputs::{TargetInputs, WeightsInput};
use crate::verdicts::{drift, full_weights, gap, ghost, weights, Judged, Verdict};

/// The `probe` of a walk problem's record.
pub const DISCOVERY: &str = "discovery";

/// The verdict of a walk problem's record by the target's layout: a
/// directory that cannot be listed is an error (nothing unreadable passes),
/// a link not followed out of the root a skip.
pub fn walk_problem(layout: &str) -> Option<Verdict> {
    match layout {
        "unreadable" => Some(Verdict::Error),
        "outside-root" => Some(Verdict::Skip),
        _ => None,
    }
}

fn record(
    store: &OsStr,
    adapter: Option<OsString>,
    inputs: &TargetInputs,
    judged: Judged,
    kind: Option<String>,
) -> Record {
    Record {
        store: store.to_os_string(),
        adapter,
        layout: inputs.layout.clone(),
        checkpoint_kind: kind,
        judged,
        json: None,
    }
}

/// For each adapter version, the version before it of the same adapter
/// (same parent directory; for a named adapter of a multi-adapter save,
/// `<version>/<name>`, the same name in the version before), or None;
/// `items` are in version order.
pub fn previous_versions(items: &[WeightsInput]) -> Vec<Option<usize>> {
    let paths: std::collections::HashSet<&Path> =
        items.iter().map(|w| w.adapter.as_path()).collect();
    let mut last: HashMap<(PathBuf, OsString), usize> = HashMap::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = item.adapter.as_path();
        let parent = path.parent().unwrap_or(Path::new(""));
        let key = if paths.contains(parent) {
            (
                parent.parent().unwrap_or(Path::new("")).to_path_buf(),
                path.file_name().unwrap_or_default().to_os_string(),
            )
        } else {
            (parent.to_path_buf(), OsString::new())
        };
        out.push(last.get(&key).copied());
        last.insert(key, i);
    }
    out
}

/// The records of one target's gathered inputs.
pub fn records_for(inputs: &TargetInputs, options: &ScanOptions) -> Vec<Record> {
    let store = python_path(&inputs.store);
    if let Some(verdict) = walk_problem(&inputs.layout) {
        return inputs
            .broken
            .iter()
            .map(|(_, why)| {
                record(
                    &store,
                    None,
                    inputs,
                    Judged::bare(DISCOVERY, verdict, why.clone()),
                    None,
                )
            })
            .collect();
    }
    let mut out = Vec::new();
    if let (Some(o), Some(given)) = (&options.gap, &inputs.gap) {
        let judged = gap::judge_gap(given, o);
        out.push(record(
            &store,
            None,
            inputs,
            judged,
            inputs.checkpoint_kind.clone(),
        ));
    }
    if let (Some(o), Some(given)) = (&options.drift, &inputs.drift) {
        let judged = drift::judge_drift(given, o);
        out.push(record(
            &store,
            None,
            inputs,
            judged,
            inputs.checkpoint_kind.clone(),
        ));
    }
    // (adapter, probe, verdict, kind), in the order the Python listed them:
    // the adapter probes by name, each over the versions in order, then the
    // adapters whose versions are unknown.
    let mut per_adapter: Vec<(OsString, &'static str, Judged, Option<String>)> = Vec::new();
    let broken = |kind: &'static str, per_adapter: &mut Vec<_>| {
        for (adapter, reason) in &inputs.broken {
            per_adapter.push((
                python_path(adapter),
                kind,
                Judged::bare(kind, Verdict::Error, reason.clone()),
                None,
            ));
        }
    };
    if let Some(o) = &options.weights {
        let previous = previous_versions(&inputs.weights);
        for (item, prev) in inputs.weights.iter().zip(previous) {
            let before = prev.and_then(|i| inputs.weights.get(i));
            let judged = weights::judge_weights(item, before, o);
            per_adapter.push((
                python_path(&item.adapter),
                weights::KIND,
                judged,
                Some(item.checkpoint_kind.clone()),
            ));
        }
        broken(weights::KIND, &mut per_adapter);
    }
    if let Some(o) = &options.full_weights {
        for item in &inputs.full_weights {
            let judged = full_weights::judge_full_weights(item, o);
            per_adapter.push((
                python_path(&item.adapter),
                full_weights::KIND,
                judged,
                Some(item.checkpoint_kind.clone()),
            ));
        }
        broken(full_weights::KIND, &mut per_adapter);
    }
    if let Some(o) = &options.ghost {
        for item in &inputs.ghosts {
            let judged = ghost::judge_ghost(item, o);
            per_adapter.push((
                python_path(&item.adapter),
                ghost::KIND,
                judged,
                Some(item.checkpoint_kind.clone()),
            ));
        }
        broken(ghost::KIND, &mut per_adapter);
    }
    // Versions in the order first met, each version's probes by name.
    let mut rank: HashMap<OsString, usize> = HashMap::new();
    for (adapter, ..) in &per_adapter {
        let next = rank.len();
        rank.entry(adapter.clone()).or_insert(next);
    }
    per_adapter.sort_by(|a, b| (rank.get(&a.0), a.1).cmp(&(rank.get(&b.0), b.1)));
    for (adapter, _, judged, kind) in per_adapter {
        out.push(record(&store, Some(adapter), inputs, judged, kind));
    }
    out
}
