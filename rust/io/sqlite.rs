//! SQLite files opened for reading only, the way an untrusted file must be:
//! checked to be a regular file inside the scanned root that starts with
//! SQLite's header, opened `immutable` (no lock, no journal, no `-wal` or
//! `-shm` file created: the input is never changed), with the defensive
//! setting on, small limits on strings and SQL, and a step budget per
//! connection that grows with the file's size (a reader that reads a file
//! through one connection has one budget per file, linear in its size), so
//! a crafted file (a recursive view) cannot make a read run for ever.
//!
//! `immutable` also means a database left mid-write in WAL mode is read as
//! its main file holds it, without the newest pages still in `-wal`.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::error::{Area, Error, Result};
use crate::io::files::open_regular;

/// The first 16 bytes of every SQLite 3 database.
pub const MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// Largest database opened.
pub const MAX_DB_BYTES: u64 = 64 << 30;
/// Virtual-machine steps a connection's queries may take whatever the
/// file's size (checked every 1,000 steps).
const BASE_STEPS: u64 = 20_000_000;
/// Steps a connection may take per byte of the file, beyond
/// [`BASE_STEPS`]: a full scan of a table takes about ten steps per row,
/// and a row is at least a few bytes, so a reader that scans each table
/// once needs under two per byte.
const STEPS_PER_BYTE: u64 = 16;
/// Longest string or blob SQLite will hold for us.
const MAX_VALUE_BYTES: i32 = 1 << 20;

/// The steps a connection to a file of `len` bytes may take: enough for a
/// reader that scans each of its tables a few times, linear in its size.
pub fn step_budget(len: u64) -> u64 {
    BASE_STEPS.saturating_add(len.saturating_mul(STEPS_PER_BYTE))
}

/// `file:` URI of an absolute path, as SQLite reads one: each byte that is
/// not unreserved (RFC 3986) or a `/` is written `%XX`, so a `?`, `#` or `%`
/// in a folder's name stays part of the path. Written here rather than
/// taken from the `url` crate, whose IDNA/Unicode tables are a fifth of a
/// scan-only build's crates and are not needed for a local path.
/// `None` for a path that is not absolute.
pub fn file_uri(absolute: &Path) -> Option<String> {
    if !absolute.is_absolute() {
        return None;
    }
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        absolute.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = {
        // `C:\runs\mlflow.db` is `file:///C:/runs/mlflow.db` (not tested:
        // no Windows machine builds this crate here).
        let text = absolute.to_str()?.replace('\\', "/");
        let text = if text.starts_with('/') {
            text
        } else {
            format!("/{text}")
        };
        text.into_bytes()
    };
    use std::fmt::Write as _;
    let mut uri = String::with_capacity(bytes.len() + 8);
    uri.push_str("file://");
    for &b in &bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            uri.push(char::from(b));
        } else {
            let _ = write!(uri, "%{b:02X}");
        }
    }
    Some(uri)
}

/// A read-only connection to an untrusted SQLite file.
pub struct Db {
    conn: Connection,
    path: std::path::PathBuf,
}

/// Whether the file at `path` starts like an SQLite 3 database (reads 16
/// bytes of a regular file; anything else is no).
pub fn is_sqlite(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut file) = open_regular(path, Area::LogFormat) else {
        return false;
    };
    let mut head = [0u8; 16];
    file.read_exact(&mut head).is_ok() && &head == MAGIC
}

impl Db {
    /// Open `path` (see the module doc for what is checked and set).
    pub fn open(path: &Path, area: Area) -> Result<Db> {
        let err = |m: String| Error::new(area, path, m);
        let file = open_regular(path, area)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(area, path, &e))?
            .len();
        if len > MAX_DB_BYTES {
            return Err(err(format!(
                "is {len} bytes, more than the {MAX_DB_BYTES} an SQLite store is read up to"
            )));
        }
        if !is_sqlite(path) {
            return Err(
                crate::io::lfs::pointer_error_in(area, path).unwrap_or_else(|| {
                    err("is not an SQLite database (no \"SQLite format 3\" header)".into())
                }),
            );
        }
        // A file URI names an absolute path: a relative one (`mlflow.db`
        // given from its folder) is taken from the working directory.
        let absolute = std::path::absolute(path).map_err(|e| Error::io(area, path, &e))?;
        let uri = file_uri(&absolute).ok_or_else(|| err("cannot be named as a file URI".into()))?
            + "?immutable=1";
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&uri, flags)
            .map_err(|e| err(format!("cannot be opened as SQLite: {e}")))?;
        let set = |e: rusqlite::Error| err(format!("cannot be opened safely: {e}"));
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)
            .map_err(set)?;
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA,
            false,
        )
        .map_err(set)?;
        use rusqlite::limits::Limit;
        for (limit, value) in [
            (Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES),
            (Limit::SQLITE_LIMIT_SQL_LENGTH, 1 << 16),
            (Limit::SQLITE_LIMIT_ATTACHED, 0),
        ] {
            conn.set_limit(limit, value).map_err(set)?;
        }
        let db = Db {
            conn,
            path: path.to_path_buf(),
        };
        db.limit_steps(step_budget(len));
        Ok(db)
    }

    /// Stop any query after about `steps` virtual-machine steps (counted
    /// over the connection's life from now; [`Db::open`] sets
    /// [`step_budget`] of the file's size).
    pub fn limit_steps(&self, steps: u64) {
        let mut taken = 0u64;
        self.conn.progress_handler(
            1000,
            Some(move || {
                taken += 1000;
                taken > steps
            }),
        );
    }

    /// Call `each` on every row of `sql` with `params`, one at a time
    /// (nothing is collected); an error of SQLite's or of `each` stops it.
    pub fn for_each_row(
        &self,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
        mut each: impl FnMut(&rusqlite::Row<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut statement = self.conn.prepare(sql).map_err(|e| self.unread(e))?;
        let mut rows = statement.query(params).map_err(|e| self.unread(e))?;
        while let Some(r) = rows.next().map_err(|e| self.unread(e))? {
            each(r)?;
        }
        Ok(())
    }

    /// SQLite's error, as this file's.
    fn unread(&self, e: rusqlite::Error) -> Error {
        Error::new(
            Area::LogFormat,
            &self.path,
            format!("could not be read as the expected SQLite tables: {e}"),
        )
    }

    /// The path the database was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rows of `sql` with `params`, each mapped by `row`, at most
    /// `max_rows` of them (more is an error naming the cap).
    pub fn rows<T>(
        &self,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
        max_rows: usize,
        mut row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let err = |e: rusqlite::Error| self.unread(e);
        let mut statement = self.conn.prepare(sql).map_err(err)?;
        let mut rows = statement.query(params).map_err(err)?;
        let mut out = vec![];
        while let Some(r) = rows.next().map_err(err)? {
            if out.len() >= max_rows {
                return Err(Error::new(
                    Area::LogFormat,
                    &self.path,
                    format!("holds more than {max_rows} rows where this reader reads at most that"),
                ));
            }
            out.push(row(r).map_err(err)?);
        }
        Ok(out)
    }

    /// Whether the database has a table called `name`.
    pub fn has_table(&self, name: &str) -> bool {
        self.rows(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            &[&name],
            1,
            |_| Ok(()),
        )
        .is_ok_and(|r| !r.is_empty())
    }

    /// Whether `table` has a column called `column` (an old or hand-made
    /// store may lack one a newer release added).
    pub fn has_column(&self, table: &str, column: &str) -> bool {
        self.rows(
            "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2",
            &[&table, &column],
            1,
            |_| Ok(()),
        )
        .is_ok_and(|r| !r.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make_db(path: &Path) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE t (k TEXT, v REAL); INSERT INTO t VALUES ('a', 1.5), ('b', 2.5);",
        )
        .unwrap();
    }

    #[test]
    fn a_folder_named_with_uri_characters_is_opened_where_it_is() {
        // `?`, `#` and `%` end or escape a URI's path: written as they are,
        // SQLite would open another file (or none).
        let dir = tempfile::tempdir().unwrap();
        let mut names = vec!["a b?c=1#d", "100%25", "ü ñ", "x%", "immutable=0&mode=rw"];
        if cfg!(unix) {
            names.push("tab\tnew\nline");
        }
        for name in names {
            let folder = dir.path().join(name);
            std::fs::create_dir(&folder).unwrap();
            let path = folder.join("mlflow.db");
            make_db(&path);
            let db = Db::open(&path, Area::LogFormat).unwrap();
            assert!(db.has_table("t"), "{name}");
        }
        // The same names one folder up hold no database: nothing was opened
        // anywhere but at the path given.
        assert!(std::fs::read_dir(dir.path())
            .unwrap()
            .all(|e| e.unwrap().path().is_dir()));
    }

    #[cfg(unix)]
    #[test]
    fn a_path_that_is_not_utf8_is_opened_too() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let folder = dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"run-\xff\xfe"));
        std::fs::create_dir(&folder).unwrap();
        let path = folder.join("mlflow.db");
        make_db(&path);
        assert!(Db::open(&path, Area::LogFormat).unwrap().has_table("t"));
    }

    fn percent_decoded(text: &str) -> Vec<u8> {
        let b = text.as_bytes();
        let (mut out, mut i) = (Vec::new(), 0);
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn a_file_uri_decodes_to_its_path(parts in proptest::collection::vec(".{0,12}", 1..5)) {
            let path: std::path::PathBuf =
                std::iter::once("/".to_string()).chain(parts.into_iter().filter(|p| !p.is_empty() && !p.contains('/') && !p.contains('\0'))).collect();
            let uri = file_uri(&path).unwrap();
            let body = uri.strip_prefix("file://").unwrap();
            proptest::prop_assert!(body.bytes().all(|b| b.is_ascii_alphanumeric() || b"/-._~%".contains(&b)));
            proptest::prop_assert_eq!(percent_decoded(body), path.to_str().unwrap().as_bytes());
        }
    }

    #[test]
    fn a_relative_path_has_no_file_uri() {
        assert_eq!(file_uri(Path::new("mlflow.db")), None);
        assert_eq!(
            file_uri(Path::new("/r/a b")).as_deref(),
            Some("file:///r/a%20b")
        );
    }

    #[test]
    fn reads_rows_and_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        make_db(&path);
        let before = std::fs::read(&path).unwrap();
        let db = Db::open(&path, Area::LogFormat).unwrap();
        assert!(db.has_table("t") && !db.has_table("nope"));
        assert!(db.has_column("t", "v") && !db.has_column("t", "status"));
        assert!(!db.has_column("nope", "v"));
        let rows = db
            .rows("SELECT k, v FROM t ORDER BY k", &[], 10, |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?))
            })
            .unwrap();
        assert_eq!(rows, vec![("a".into(), 1.5), ("b".into(), 2.5)]);
        let e = db.rows("SELECT k FROM t", &[], 1, |_| Ok(())).unwrap_err();
        assert!(e.message.contains("more than 1 rows"), "{}", e.message);
        drop(db);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no journal, -wal or -shm file was made");
    }

    #[test]
    fn what_is_no_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        std::fs::write(&path, b"hello").unwrap();
        let e = Db::open(&path, Area::LogFormat).err().unwrap();
        assert!(
            e.message.contains("not an SQLite database"),
            "{}",
            e.message
        );
        // A valid header over garbage opens, and its queries fail cleanly.
        let mut bytes = MAGIC.to_vec();
        bytes.extend(std::iter::repeat_n(0xa5u8, 8192));
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(db) = Db::open(&path, Area::LogFormat) {
            assert!(!db.has_table("t"));
            assert!(db.rows("SELECT * FROM t", &[], 10, |_| Ok(())).is_err());
        }
        assert!(!is_sqlite(dir.path()));
    }

    #[test]
    fn a_runaway_query_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        make_db(&path);
        let db = Db::open(&path, Area::LogFormat).unwrap();
        db.limit_steps(1_000_000);
        // A recursive query that never ends on its own.
        let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
                   SELECT count(*) FROM c";
        let e = db.rows(sql, &[], 1, |_| Ok(())).unwrap_err();
        assert!(e.message.contains("interrupt"), "{}", e.message);
        // Without a limit set, the budget is the file's: small for a small
        // file.
        let db = Db::open(&path, Area::LogFormat).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(step_budget(len) < 2 * BASE_STEPS);
        let e = db.for_each_row(sql, &[], |_| Ok(())).unwrap_err();
        assert!(e.message.contains("interrupt"), "{}", e.message);
    }

    #[test]
    fn rows_stream_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        make_db(&path);
        let db = Db::open(&path, Area::LogFormat).unwrap();
        let mut seen = vec![];
        db.for_each_row("SELECT k FROM t ORDER BY k", &[], |r| {
            seen.push(r.get::<_, String>(0).unwrap());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, ["a", "b"]);
        let e = db
            .for_each_row("SELECT k FROM t", &[], |_| {
                Err(Error::new(Area::LogFormat, "", "stop"))
            })
            .unwrap_err();
        assert_eq!(e.message, "stop");
    }
}
