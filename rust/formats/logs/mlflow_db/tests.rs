use super::*;
use rusqlite::Connection;

/// A store with MLflow's three tables, as its migrations leave them
/// (columns read here only).
fn store(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT);
         CREATE TABLE runs (run_uuid TEXT PRIMARY KEY, name TEXT, experiment_id INTEGER,
                            lifecycle_stage TEXT, start_time INTEGER);
         CREATE TABLE metrics (key TEXT, value REAL, timestamp INTEGER, run_uuid TEXT,
                               step INTEGER, is_nan INTEGER);
         INSERT INTO experiments VALUES (1, 'sft');
         INSERT INTO runs VALUES ('r1', 'good', 1, 'active', 1), ('r2', 'gone', 1, 'deleted', 2),
                                 ('r3', NULL, 1, 'active', 3);",
    )
    .unwrap();
    conn
}

fn log(conn: &Connection, run: &str, key: &str, step: i64, value: f64, is_nan: bool) {
    conn.execute(
        "INSERT INTO metrics VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        rusqlite::params![key, value, step * 10, run, step, is_nan as i64],
    )
    .unwrap();
}

#[test]
fn runs_are_listed_and_named_and_their_curves_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_NAME);
    let conn = store(&path);
    for step in 0..5 {
        log(
            &conn,
            "r1",
            "train/nll_loss",
            step,
            2.0 - step as f64 / 10.0,
            false,
        );
        log(&conn, "r1", "learning_rate", step, 1e-4, false);
    }
    log(&conn, "r1", "train/nll_loss", 5, 0.0, true);
    log(&conn, "r1", "train/nll_loss", 6, f64::MAX, false);
    log(&conn, "r3", "accuracy", 0, 0.5, false);
    drop(conn);
    assert!(is_mlflow_db(&path));
    let found = runs(&path).unwrap();
    let ids: Vec<&str> = found.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["r1", "r3"], "the deleted run is passed over");
    assert_eq!(found[0].label(), "sft/good (r1)");
    assert_eq!(found[1].label(), "sft/r3");
    let at = run_path(&path, &found[0]);
    assert_eq!(at, path.join("1").join("r1"));
    assert_eq!(split_run_path(&at), Some((path.clone(), "r1".to_string())));
    assert_eq!(split_run_path(&path.join("x").join("r1")), None);
    let curve = read_run_curve(&path, "r1", None).unwrap();
    assert_eq!(curve.series, "train/nll_loss");
    assert_eq!(curve.run, "sft/good (r1)");
    assert_eq!(curve.steps, (0..7).collect::<Vec<_>>());
    assert!(curve.losses[5].is_infinite() && curve.losses[6].is_infinite());
    assert_eq!(curve.side.learning_rate.len(), 5);
    let e = read_run_curve(&path, "r3", None).unwrap_err();
    assert!(
        crate::formats::logs::loss_log::is_no_loss_series(&e),
        "{}",
        e.message
    );
    let e = read_run_curve(&path, "nope", None).unwrap_err();
    assert_eq!(e.area, Area::Missing);
    let e = read_run_curve(&path, "r1", Some("nope")).unwrap_err();
    assert_eq!(e.area, Area::Usage);
}

#[test]
fn the_params_hf_logged_say_what_the_loss_is_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_NAME);
    let conn = store(&path);
    for step in 0..5 {
        log(&conn, "r1", "loss", step, 600.0 - step as f64, false);
        log(&conn, "r3", "loss", step, 2.0 - step as f64 / 10.0, false);
    }
    conn.execute_batch(
        "CREATE TABLE params (key TEXT, value TEXT, run_uuid TEXT);
         INSERT INTO params VALUES ('architectures', '[''GPT2LMHeadModel'']', 'r1'),
                                   ('vocab_size', '128', 'r1'), ('learning_rate', '10.0', 'r1'),
                                   ('vocab_size', 7, 'r3');",
    )
    .unwrap();
    drop(conn);
    let curve = read_run_curve(&path, "r1", None).unwrap();
    let classes = curve.output_classes.unwrap();
    assert_eq!((classes.count, classes.kind.as_str()), (128, "vocabulary"));
    // No architectures logged (and a value of the wrong type): no K.
    assert_eq!(
        read_run_curve(&path, "r3", None).unwrap().output_classes,
        None
    );
    // This store's runs have no status column: nothing said of the end.
    assert_eq!(read_run_curve(&path, "r1", None).unwrap().side.ending, None);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE runs ADD COLUMN status TEXT;
         UPDATE runs SET status = 'FAILED' WHERE run_uuid = 'r1';",
    )
    .unwrap();
    drop(conn);
    let ending = read_run_curve(&path, "r1", None).unwrap().side.ending;
    assert!(matches!(ending, Some(RunEnd::Crashed(why)) if why.contains("FAILED")));
}

/// A store of `n` runs `r0..`, each logging a falling loss and a
/// learning rate, with no index (as a crafted file may have none).
fn many_runs(path: &Path, n: usize) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE experiments (experiment_id INTEGER, name TEXT);
         CREATE TABLE runs (run_uuid TEXT, name TEXT, experiment_id INTEGER,
                            lifecycle_stage TEXT, start_time INTEGER);
         CREATE TABLE metrics (key TEXT, value REAL, timestamp INTEGER, run_uuid TEXT,
                               step INTEGER, is_nan INTEGER);
         INSERT INTO experiments VALUES (1, 'sft');
         BEGIN;",
    )
    .unwrap();
    for i in 0..n {
        let id = format!("r{i}");
        conn.execute(
            "INSERT INTO runs VALUES (?1, ?1, 1, 'active', ?2)",
            rusqlite::params![id, i as i64],
        )
        .unwrap();
        for step in 0..4 {
            log(&conn, &id, "loss", step, 2.0 - step as f64 / 10.0, false);
            log(&conn, &id, "learning_rate", step, 1e-4, false);
            log(&conn, &id, "accuracy", step, 0.5, false);
        }
    }
    conn.execute_batch("COMMIT;").unwrap();
}

thread_local! {
    /// Passes over `metrics` made on this thread.
    pub(super) static PASSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[test]
fn a_scan_reads_each_file_once_and_each_run_alike() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_NAME);
    many_runs(&path, 50);
    // On its own, each run is one pass.
    let before = PASSES.with(|n| n.get());
    let alone: Vec<LossCurve> = (0..50)
        .map(|i| read_run_curve(&path, &format!("r{i}"), None).unwrap())
        .collect();
    assert_eq!(PASSES.with(|n| n.get()) - before, 50);
    // Listed for a scan, the first read makes the one pass for all.
    let before = PASSES.with(|n| n.get());
    let listed = runs(&path).unwrap();
    assert_eq!(listed.len(), 50);
    for (run, want) in listed.iter().zip(&alone) {
        let (db, id) = split_run_path(&run_path(&path, run)).unwrap();
        let got = read_run_curve(&db, &id, None).unwrap();
        assert_eq!(got, *want);
        assert_eq!(got.steps, [0, 1, 2, 3]);
        assert_eq!(got.side.learning_rate.len(), 4);
    }
    assert_eq!(PASSES.with(|n| n.get()) - before, 1);
    // Nothing is held once every run listed was read.
    assert!(!lock(&LISTED).iter().any(|l| l.file.path == path));
    // A file changed after listing is read afresh.
    let listed = runs(&path).unwrap();
    log(
        &Connection::open(&path).unwrap(),
        "r0",
        "loss",
        9,
        0.1,
        false,
    );
    let curve = read_run_curve(&path, &listed[0].run_id, None).unwrap();
    assert_eq!(curve.steps.last(), Some(&9));
}

#[test]
fn run_ids_that_are_paths_stay_below_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_NAME);
    let conn = store(&path);
    let hostile = ["/etc/passwd", "../x", "..", ".", "", "%41", "a\\b", "a\nb"];
    for (i, id) in hostile.iter().enumerate() {
        conn.execute(
            "INSERT INTO runs VALUES (?1, 'evil', 1, 'active', ?2)",
            rusqlite::params![id, 10 + i as i64],
        )
        .unwrap();
        for step in 0..3 {
            log(&conn, id, "loss", step, 1.0 + step as f64, false);
        }
    }
    drop(conn);
    let found = runs(&path).unwrap();
    assert_eq!(found.len(), 2 + hostile.len());
    for run in &found {
        let at = run_path(&path, run);
        assert_eq!(at.parent(), Some(path.join("1").as_path()), "{at:?}");
        let name = at.file_name().unwrap().to_str().unwrap();
        assert!(!name.contains('/') && name != "." && name != ".." && !name.is_empty());
        assert_eq!(
            split_run_path(&at),
            Some((path.clone(), run.run_id.clone()))
        );
    }
    assert_eq!(id_name("/etc/passwd"), "%2Fetc%2Fpasswd");
    for id in hostile {
        let (db, run) = split_run_path(&path.join("1").join(id_name(id))).unwrap();
        assert_eq!(run, id);
        assert_eq!(read_run_curve(&db, &run, None).unwrap().steps, [0, 1, 2]);
    }
}

#[test]
fn a_cell_of_the_wrong_type_spoils_only_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_NAME);
    many_runs(&path, 4);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "UPDATE runs SET experiment_id = 'abc' WHERE run_uuid = 'r1';
         UPDATE runs SET name = x'ff00' WHERE run_uuid = 'r3';
         UPDATE metrics SET value = 'oops' WHERE run_uuid = 'r2' AND key = 'loss' AND step = 2;
         UPDATE metrics SET value = 'fine' WHERE run_uuid = 'r3' AND key = 'accuracy';
         UPDATE runs SET start_time = 'late' WHERE run_uuid = 'r0';",
    )
    .unwrap();
    drop(conn);
    let listed = runs(&path).unwrap();
    assert_eq!(listed.len(), 4, "every run is listed");
    let read: Vec<(String, Result<LossCurve>)> = listed
        .iter()
        .map(|r| (r.run_id.clone(), read_run_curve(&path, &r.run_id, None)))
        .collect();
    for (id, curve) in &read {
        match id.as_str() {
            "r1" => {
                let e = curve.as_ref().unwrap_err();
                assert!(e.message.contains("experiment_id"), "{e}");
            }
            "r2" => {
                let e = curve.as_ref().unwrap_err();
                assert!(
                    e.message.contains("value") && e.message.contains("text"),
                    "{e}"
                );
            }
            _ => assert_eq!(curve.as_ref().unwrap().steps, [0, 1, 2, 3], "{id}"),
        }
    }
    // Read on their own, alike.
    assert!(read_run_curve(&path, "r2", None).is_err());
    assert!(read_run_curve(&path, "r3", None).is_ok());
}

#[test]
fn a_recursive_view_costs_one_budget_per_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_NAME);
    many_runs(&path, 3);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TABLE experiments;
         CREATE VIEW experiments AS WITH RECURSIVE c(x) AS
             (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x AS experiment_id,
             'e' AS name FROM c;",
    )
    .unwrap();
    drop(conn);
    // A view is no table of experiments: never queried, the runs read
    // without their experiment's name.
    let listed = runs(&path).unwrap();
    assert_eq!(listed.len(), 3);
    for run in &listed {
        assert_eq!(run.experiment, "");
        assert!(read_run_curve(&path, &run.run_id, None).is_ok());
    }
    // A runaway query on one connection stops within the file's budget.
    let db = Db::open(&path, Area::LogFormat).unwrap();
    let e = db
        .for_each_row("SELECT count(*) FROM experiments", &[], |_| Ok(()))
        .unwrap_err();
    assert!(e.message.contains("interrupt"), "{e}");
}

#[test]
fn other_sqlite_files_are_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE runs (x INTEGER);")
        .unwrap();
    assert!(!is_mlflow_db(&path));
    assert!(runs(&path).is_err());
}
