//! One run, one verdict: a tracker run that is an HF output folder's run.
//!
//! An HF Trainer that reports to W&B or MLflow leaves the same run twice
//! on disk: its output folder (`trainer_state.json`, checkpoints) and the
//! tracker's run (`wandb/run-*/`, `mlruns/<experiment>/<run>/`,
//! `mlflow.db`), usually side by side in the folder the training was
//! started from. Judged apart, one scan shows the run twice, and the two
//! can disagree (K read from one and not the other). The Trainer's
//! callbacks log its arguments, `output_dir` among them; where that names
//! an output folder the same scan judged, the tracker's record becomes a
//! skip that names the folder, and the folder's record names the tracker
//! run it was also logged as (`also_logged_as`).
//!
//! A relative `output_dir` is taken from the folder the tracker's files
//! sit in: W&B and MLflow write `wandb/`, `mlruns/` and `mlflow.db` into
//! the working directory by default, which is where a relative output
//! folder lies too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::store::layout;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{Judged, Value, Verdict};

use super::{json, Record};

/// The folder a tracker run's files were written from (where a relative
/// `output_dir` lies): the parent of `wandb/`, `mlruns/` or `mlflow.db`.
fn started_from(store: &Path) -> Option<&Path> {
    store.ancestors().skip(1).take(4).find_map(|dir| {
        let name = dir.file_name()?.to_str()?;
        let tracker_folder = layout::TRACKER_FOLDERS.contains(&name)
            || name == crate::formats::logs::mlflow_db::DB_NAME;
        if tracker_folder {
            dir.parent()
        } else {
            None
        }
    })
}

/// The real path of the output folder a tracker record's run logged.
fn logged_output_dir(record: &Record) -> Option<PathBuf> {
    let Some(Value::Text(dir)) = record.judged.evidence.get("trainer_output_dir") else {
        return None;
    };
    let store = Path::new(&record.store);
    let path = Path::new(dir);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        started_from(store)?.join(path)
    };
    std::fs::canonicalize(path).ok()
}

/// Fold each tracker record whose run logged an output folder judged in
/// the same scan into that folder's record (see the module docs); `json`:
/// rewrite the JSON text of the records changed.
pub fn fold_tracker_runs(records: &mut [Record], json: bool) {
    let kind = crate::verdicts::drift::KIND;
    let is_drift = |r: &Record| r.judged.kind == kind && r.adapter.is_none();
    let folders: HashMap<PathBuf, usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| is_drift(r) && r.layout == layout::HF_TRAINER)
        .filter_map(|(i, r)| Some((std::fs::canonicalize(Path::new(&r.store)).ok()?, i)))
        .collect();
    if folders.is_empty() {
        return;
    }
    let trackers = [layout::WANDB, layout::MLFLOW];
    let mut folded: Vec<(usize, usize)> = vec![];
    for (i, r) in records.iter().enumerate() {
        if is_drift(r) && trackers.contains(&r.layout.as_str()) {
            if let Some(&folder) = logged_output_dir(r).and_then(|d| folders.get(&d)) {
                folded.push((i, folder));
            }
        }
    }
    for (tracker, folder) in folded {
        let label = match records[tracker].judged.evidence.get("run") {
            Some(Value::Text(t)) => t.clone(),
            _ => crate::io::path_text::display(Path::new(&records[tracker].store)),
        };
        let folder_store = records[folder].store.clone();
        let what = if records[tracker].layout == layout::WANDB {
            "W&B"
        } else {
            "MLflow"
        };
        let old = std::mem::replace(
            &mut records[tracker].judged,
            Judged::bare(kind, Verdict::Skip, ""),
        );
        let mut evidence = Evidence::new();
        evidence.put(
            "same_run_as",
            crate::io::path_text::display(Path::new(&folder_store)),
        );
        evidence.put("folded_verdict", old.verdict.as_str());
        evidence.extend(old.evidence);
        records[tracker].judged = Judged::bare(
            kind,
            Verdict::Skip,
            format!(
                "the same run as {} (the output_dir its {what} run logged): judged there, not \
                 twice (its own log would say: {})",
                crate::io::path_text::display(Path::new(&folder_store)),
                old.verdict.as_str()
            ),
        )
        .with_evidence(evidence);
        let also = match records[folder].judged.evidence.get("also_logged_as") {
            Some(Value::List(items)) => {
                let mut items = items.clone();
                items.push(Value::Text(format!("{what}: {label}")));
                items
            }
            _ => vec![Value::Text(format!("{what}: {label}"))],
        };
        records[folder]
            .judged
            .evidence
            .put("also_logged_as", Value::List(also));
        if json {
            for i in [tracker, folder] {
                records[i].json = Some(json::record_json(&records[i]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(store: &Path, layout: &str, evidence: Evidence) -> Record {
        Record {
            store: store.as_os_str().to_os_string(),
            adapter: None,
            layout: layout.to_string(),
            checkpoint_kind: None,
            judged: Judged::bare(crate::verdicts::drift::KIND, Verdict::Pass, "ok")
                .with_evidence(evidence),
            json: None,
        }
    }

    #[test]
    fn tracker_files_were_written_from_the_folder_above_them() {
        let at = |p: &str| started_from(Path::new(p)).map(Path::to_path_buf);
        assert_eq!(at("/p/wandb/run-1"), Some(PathBuf::from("/p")));
        assert_eq!(at("/p/mlruns/0/abc"), Some(PathBuf::from("/p")));
        assert_eq!(at("/p/mlflow.db/1/abc"), Some(PathBuf::from("/p")));
        assert_eq!(at("/p/runs/x"), None);
    }

    #[test]
    fn only_a_tracker_run_that_logged_a_judged_folder_is_folded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for d in ["out", "other", "wandb/run-a", "wandb/run-b", "wandb/run-c"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        let logged = |dir: &str, run: &str| {
            let mut e = Evidence::new();
            e.put("trainer_output_dir", dir);
            e.put("run", run);
            e
        };
        let abs = p.join("out").display().to_string();
        let mut records = vec![
            record(&p.join("out"), layout::HF_TRAINER, Evidence::new()),
            record(
                &p.join("wandb/run-a"),
                layout::WANDB,
                logged("out", "proj/a (1)"),
            ),
            record(
                &p.join("wandb/run-b"),
                layout::WANDB,
                logged(&abs, "proj/b (2)"),
            ),
            // Another folder, not judged in this scan: left alone.
            record(
                &p.join("wandb/run-c"),
                layout::WANDB,
                logged("other", "proj/c (3)"),
            ),
        ];
        fold_tracker_runs(&mut records, true);
        let verdicts: Vec<Verdict> = records.iter().map(|r| r.judged.verdict).collect();
        assert_eq!(
            verdicts,
            [Verdict::Pass, Verdict::Skip, Verdict::Skip, Verdict::Pass]
        );
        let Some(Value::List(also)) = records[0].judged.evidence.get("also_logged_as") else {
            panic!("no also_logged_as");
        };
        assert_eq!(also.len(), 2);
        assert!(records[1].json.as_deref().unwrap().contains("same_run_as"));
        assert!(records[3].json.is_none());
    }
}
