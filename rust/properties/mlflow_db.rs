//! Properties of the MLflow SQLite store reader: a valid store with any
//! bytes changed, or any bytes behind SQLite's header, is read or refused
//! without a panic, and the file is never changed by reading it.

use super::*;
use adapterprobe_core::formats::logs::mlflow_db::{read_run_curve, runs};

/// A small store with MLflow's tables and one run of 200 points.
fn valid_store() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlflow.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT);
         CREATE TABLE runs (run_uuid TEXT PRIMARY KEY, name TEXT, experiment_id INTEGER,
                            lifecycle_stage TEXT, start_time INTEGER);
         CREATE TABLE metrics (key TEXT, value REAL, timestamp INTEGER, run_uuid TEXT,
                               step INTEGER, is_nan INTEGER);
         CREATE INDEX m ON metrics (run_uuid, key, step);
         INSERT INTO experiments VALUES (1, 'sft');
         INSERT INTO runs VALUES ('r1', 'good', 1, 'active', 1);",
    )
    .unwrap();
    for step in 0..200i64 {
        conn.execute(
            "INSERT INTO metrics VALUES ('loss', ?1, ?2, 'r1', ?2, 0)",
            rusqlite::params![2.0 - step as f64 / 200.0, step],
        )
        .unwrap();
    }
    drop(conn);
    std::fs::read(&path).unwrap()
}

fn read_all(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlflow.db");
    std::fs::write(&path, bytes).unwrap();
    if let Ok(found) = runs(&path) {
        for run in found.iter().take(5) {
            let _ = read_run_curve(&path, &run.run_id, None);
        }
    }
    let _ = read_run_curve(&path, "r1", None);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "reading changed the file"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn edited_stores_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..40)
    ) {
        let mut bytes = valid_store();
        let n = bytes.len();
        for (at, value) in edits {
            bytes[at.index(n)] = value;
        }
        read_all(&bytes);
    }

    #[test]
    fn any_bytes_behind_the_header_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..9000)
    ) {
        let mut bytes = b"SQLite format 3\0".to_vec();
        bytes.extend(body);
        read_all(&bytes);
    }
}

#[test]
fn the_valid_store_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlflow.db");
    std::fs::write(&path, valid_store()).unwrap();
    let curve = read_run_curve(&path, "r1", None).unwrap();
    assert_eq!(curve.steps.len(), 200);
}
