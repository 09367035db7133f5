//! What the store's logic needs from a database: transactions that run SQL with text and
//! integer parameters and read rows back, and a way to tell whether another server that
//! wrote to the same store is still alive. SQLite ([`crate::sqlite`]) and PostgreSQL
//! ([`crate::postgres`]) implement it; the statements are written once, in the SQL both speak,
//! with `$1`-style placeholders.

use crate::StoreError;

/// A statement parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    Text(&'a str),
    Int(i64),
}

/// A value read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Text(String),
}

impl Cell {
    pub(crate) fn into_text(self) -> Result<String, StoreError> {
        match self {
            Cell::Text(text) => Ok(text),
            other => Err(StoreError::Column(format!("expected text, read {other:?}"))),
        }
    }

    pub(crate) fn as_int(&self) -> Result<i64, StoreError> {
        match self {
            Cell::Int(value) => Ok(*value),
            other => Err(StoreError::Column(format!(
                "expected an integer, read {other:?}"
            ))),
        }
    }

    pub(crate) fn as_text(&self) -> Option<&str> {
        match self {
            Cell::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// One open transaction: committed when the closure given to [`Database::in_transaction`]
/// returns `Ok`, rolled back otherwise.
pub(crate) trait Tx {
    /// Runs a statement; returns the rows it changed.
    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError>;
    /// Runs a query; returns its rows.
    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Vec<Cell>>, StoreError>;
}

/// A database the store can live in.
pub(crate) trait Database: Send + Sync + std::fmt::Debug {
    /// Runs `body` in one write transaction (taken for writing at its start, so that two
    /// servers on one store never deadlock upgrading a read).
    fn in_transaction(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// This server's owner tag, written beside the responses it has not finished.
    fn owner(&self) -> &str;

    /// Whether the server that wrote `owner` still runs (holds its liveness lock). Never
    /// called with this server's own tag.
    fn owner_alive(&self, owner: &str) -> Result<bool, StoreError>;

    /// What the log names the store by.
    fn describe(&self) -> String;
}

/// Runs `body` in a transaction and hands back what it computed.
pub(crate) fn transaction<R>(
    db: &dyn Database,
    mut body: impl FnMut(&mut dyn Tx) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    let mut out = None;
    db.in_transaction(&mut |tx| {
        out = Some(body(tx)?);
        Ok(())
    })?;
    out.ok_or(StoreError::Column("transaction body did not run".into()))
}

/// The tables, in the SQL both databases accept. `seq` orders rows by when they were last
/// written (eviction by count drops the lowest); `owner` names the server running a
/// response that is not finished (NULL once it is).
pub(crate) const SCHEMA: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS tokenmill_responses (
         id TEXT PRIMARY KEY,
         created_at BIGINT NOT NULL,
         seq BIGINT NOT NULL,
         status TEXT NOT NULL,
         owner TEXT,
         response TEXT NOT NULL,
         input_items TEXT NOT NULL,
         context TEXT NOT NULL
     )",
    "CREATE INDEX IF NOT EXISTS tokenmill_responses_age ON tokenmill_responses (created_at, seq)",
    "CREATE INDEX IF NOT EXISTS tokenmill_responses_status ON tokenmill_responses (status)",
];
