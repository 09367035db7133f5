//! The SQLite store: one file (bundled SQLite, WAL journal) that several servers on one host
//! may share. Each server holds an exclusive lock on its own file in `<store>.owners/` while
//! it runs; the kernel drops the lock when the process dies, however it dies, so a live
//! server is one whose lock file cannot be locked.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use crate::backend::{Cell, Database, Param, Tx, SCHEMA};
use crate::StoreError;

/// How long a statement waits for another server's write before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(crate) struct Sqlite {
    conn: Mutex<Connection>,
    /// Where the owners' lock files are (`None` in memory: nothing else can see the store).
    owners_dir: Option<PathBuf>,
    owner: String,
    /// This server's lock, held for its lifetime.
    _lock: Option<File>,
    describe: String,
}

impl Sqlite {
    pub(crate) fn open(path: &Path, owner: String) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            create_dir(parent)?;
        }
        let conn = Connection::open(path)?;
        // Before anything else: switching to WAL and creating the tables race with other
        // servers opening the same file.
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Switching a fresh file to WAL takes an exclusive lock; two servers that both read
        // the file first deadlock, and SQLite answers one of them SQLITE_BUSY without waiting.
        retry_busy(|| Ok(conn.pragma_update(None, "journal_mode", "WAL")?))?;
        retry_busy(|| Ok(conn.pragma_update(None, "synchronous", "NORMAL")?))?;
        let mut owners_dir = path.as_os_str().to_owned();
        owners_dir.push(".owners");
        let owners_dir = PathBuf::from(owners_dir);
        create_dir(&owners_dir)?;
        // Locked under a temporary name, then renamed: another server never sees this
        // server's lock file unlocked (and so never takes it for a dead one's).
        let lock_path = owners_dir.join(format!("{owner}.lock"));
        let staging = owners_dir.join(format!("{owner}.starting"));
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| StoreError::Io { path, source }
        };
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&staging)
            .map_err(io(&staging))?;
        lock.lock().map_err(io(&staging))?;
        std::fs::rename(&staging, &lock_path).map_err(io(&lock_path))?;
        let store = Sqlite {
            conn: Mutex::new(conn),
            owners_dir: Some(owners_dir),
            owner,
            _lock: Some(lock),
            describe: path.display().to_string(),
        };
        retry_busy(|| store.create_tables())?;
        store.remove_litter();
        Ok(store)
    }

    /// Removes the lock files of servers that died with no unfinished run (a run's lock file
    /// goes when its run is failed): without this, every killed server would leave one.
    fn remove_litter(&self) {
        let Some(dir) = &self.owners_dir else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(tag) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
                continue;
            };
            if tag != self.owner {
                // Best effort: an unreadable file stays, and says nothing about this store.
                let _ = self.owner_alive(tag);
            }
        }
    }

    pub(crate) fn in_memory(owner: String) -> Result<Self, StoreError> {
        let store = Sqlite {
            conn: Mutex::new(Connection::open_in_memory()?),
            owners_dir: None,
            owner,
            _lock: None,
            describe: "in memory".into(),
        };
        store.create_tables()?;
        Ok(store)
    }

    fn create_tables(&self) -> Result<(), StoreError> {
        self.in_transaction(&mut |tx| {
            for statement in SCHEMA {
                tx.execute(statement, &[])?;
            }
            Ok(())
        })
    }

    fn conn(&self) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| StoreError::Poisoned)
    }
}

/// Runs `step` again while SQLite answers SQLITE_BUSY without having waited (a lock
/// deadlock between connections opening the same fresh file), up to [`BUSY_TIMEOUT`].
fn retry_busy<T>(mut step: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(2);
    loop {
        match step() {
            Err(StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

fn create_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
        path: dir.display().to_string(),
        source,
    })
}

/// `$1` placeholders as SQLite's numbered `?1` (a `$1` would be a named parameter, bound by
/// the order in which names first appear).
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

fn bind(params: &[Param<'_>]) -> Vec<rusqlite::types::Value> {
    params
        .iter()
        .map(|param| match *param {
            Param::Text(text) => rusqlite::types::Value::Text(text.to_string()),
            Param::Int(value) => rusqlite::types::Value::Integer(value),
        })
        .collect()
}

struct SqliteTx<'a>(&'a rusqlite::Transaction<'a>);

impl Tx for SqliteTx<'_> {
    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        let changed = self
            .0
            .execute(&sqlite_sql(sql), rusqlite::params_from_iter(bind(params)))?;
        Ok(changed as u64)
    }

    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        let mut statement = self.0.prepare(&sqlite_sql(sql))?;
        let columns = statement.column_count();
        let rows = statement.query_map(rusqlite::params_from_iter(bind(params)), |row| {
            (0..columns)
                .map(|i| {
                    Ok(match row.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => Cell::Null,
                        rusqlite::types::ValueRef::Integer(value) => Cell::Int(value),
                        rusqlite::types::ValueRef::Text(text) => {
                            Cell::Text(String::from_utf8_lossy(text).into_owned())
                        }
                        rusqlite::types::ValueRef::Real(value) => Cell::Int(value as i64),
                        rusqlite::types::ValueRef::Blob(blob) => {
                            Cell::Text(String::from_utf8_lossy(blob).into_owned())
                        }
                    })
                })
                .collect::<Result<Vec<Cell>, rusqlite::Error>>()
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl Database for Sqlite {
    fn in_transaction(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        body(&mut SqliteTx(&tx))?;
        tx.commit()?;
        Ok(())
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    fn owner_alive(&self, owner: &str) -> Result<bool, StoreError> {
        let Some(dir) = &self.owners_dir else {
            return Ok(false);
        };
        // Owner tags are this crate's own (hex); anything else names no lock file.
        if owner.is_empty()
            || !owner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Ok(false);
        }
        let path = dir.join(format!("{owner}.lock"));
        let Ok(file) = OpenOptions::new().write(true).open(&path) else {
            return Ok(false);
        };
        match file.try_lock() {
            Ok(()) => {
                // Nobody holds it: that server is gone; its file is litter.
                let _ = file.unlock();
                let _ = std::fs::remove_file(&path);
                Ok(false)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(true),
            Err(std::fs::TryLockError::Error(source)) => Err(StoreError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        // The lock goes with the file handle; the file itself is removed on a clean exit.
        if let Some(dir) = &self.owners_dir {
            let _ = std::fs::remove_file(dir.join(format!("{}.lock", self.owner)));
        }
    }
}
