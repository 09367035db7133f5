//! tokenmill-response-store: where the Responses API (`/v1/responses`) keeps what it stored.
//!
//! # Design
//!
//! One table, one row per response: the response object as JSON, the input items of its own
//! request and its *context* (every item rendered before its output: the previous responses'
//! context, their output and this request's input), so continuing a conversation by
//! `previous_response_id` is one read. Every write is one transaction, so a crash never
//! leaves a half-written response readable. The table lives in a SQLite file (bundled SQLite
//! through `rusqlite`, WAL journal; several servers on one host may share it) or in
//! PostgreSQL (`postgres://...`, shared by replicas on several hosts); the statements are
//! written once over `backend::Database`.
//!
//! The store is bounded by age (`ttl`) and count (`max_entries`): each [`ResponseStore::put`]
//! evicts in the same transaction and returns how many rows went (the server counts them in
//! a metric). A response that is `queued` or `in_progress` carries its server's *owner* tag;
//! each server holds a liveness lock for its tag while it runs (a lock file for SQLite, a
//! session advisory lock for PostgreSQL, both dropped by the OS or the database when the
//! process dies). [`ResponseStore::recover_unfinished`], run at start and then periodically,
//! marks `failed` the unfinished responses whose owner no longer holds its lock, so none
//! stays unfinished forever and a live replica's runs are never touched.
//!
//! # Usage
//!
//! ```
//! use serde_json::json;
//! use tokenmill_response_store::{Order, ResponseStore, StoreLimits, StoredResponse};
//!
//! let store = ResponseStore::in_memory(StoreLimits::default()).unwrap();
//! let response = json!({"id": "resp_1", "created_at": 10, "status": "completed", "output": []});
//! let input = vec![json!({"type": "message", "id": "msg_1", "role": "user", "content": []})];
//! store.put(&StoredResponse::new(response, input.clone(), input), 10).unwrap();
//! let page = store.input_items("resp_1", None, 20, Order::Asc).unwrap().unwrap();
//! assert_eq!((page.data.len(), page.has_more), (1, false));
//! assert!(store.delete("resp_1").unwrap());
//! ```

mod backend;
mod postgres;
mod sqlite;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use backend::{transaction, Cell, Database, Param, Tx};

/// What can go wrong with the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("response store database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("response store database: {0}")]
    Postgres(#[from] ::postgres::Error),
    #[error("response store: {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("response store: a stored row is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("response store: a response object needs a string `{0}`")]
    MissingField(&'static str),
    #[error("response store: unexpected column value: {0}")]
    Column(String),
    #[error("response store: the connection lock was poisoned")]
    Poisoned,
}

/// How far the store may grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreLimits {
    /// Responses older than this are evicted (`None`: kept until evicted by count).
    pub ttl: Option<Duration>,
    /// At most this many responses; the oldest go first (`None`: no bound).
    pub max_entries: Option<u64>,
}

/// One stored response.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The response object (`id`, `created_at`, `status`, ...).
    pub response: Value,
    /// The input items of its own request, in order, each with an `id`.
    pub input_items: Vec<Value>,
    /// Every item rendered before its output (for `previous_response_id`).
    pub context: Vec<Value>,
}

impl StoredResponse {
    pub fn new(response: Value, input_items: Vec<Value>, context: Vec<Value>) -> Self {
        StoredResponse {
            response,
            input_items,
            context,
        }
    }

    fn id(&self) -> Result<&str, StoreError> {
        self.response
            .get("id")
            .and_then(Value::as_str)
            .ok_or(StoreError::MissingField("id"))
    }

    fn status(&self) -> Result<&str, StoreError> {
        self.response
            .get("status")
            .and_then(Value::as_str)
            .ok_or(StoreError::MissingField("status"))
    }
}

/// The order of an input-item page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// One page of input items.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemPage {
    pub data: Vec<Value>,
    pub has_more: bool,
}

/// Statuses of a response that has not finished.
const UNFINISHED: [&str; 2] = ["queued", "in_progress"];

/// Where stored responses live (see the crate's documentation).
#[derive(Debug)]
pub struct ResponseStore {
    db: Box<dyn Database>,
    limits: StoreLimits,
}

/// A fresh owner tag: 16 hex digits, unique among the servers sharing a store.
fn new_owner_key() -> i64 {
    rand::random::<i64>()
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl ResponseStore {
    /// Opens (creating it and its folder if needed) the SQLite store file at `path`.
    pub fn open(path: &Path, limits: StoreLimits) -> Result<Self, StoreError> {
        let owner = format!("{:016x}", new_owner_key() as u64);
        Ok(ResponseStore {
            db: Box::new(sqlite::Sqlite::open(path, owner)?),
            limits,
        })
    }

    /// Connects to the PostgreSQL store at `url` (`postgres://user:password@host:port/db`),
    /// creating its table if needed.
    pub fn connect(url: &str, limits: StoreLimits) -> Result<Self, StoreError> {
        Ok(ResponseStore {
            db: Box::new(postgres::Postgres::connect(url, new_owner_key())?),
            limits,
        })
    }

    /// Whether `location` names a PostgreSQL store rather than a SQLite file.
    pub fn is_database_url(location: &str) -> bool {
        location.starts_with("postgres://") || location.starts_with("postgresql://")
    }

    /// A store that lives only as long as the process (tests).
    pub fn in_memory(limits: StoreLimits) -> Result<Self, StoreError> {
        let owner = format!("{:016x}", new_owner_key() as u64);
        Ok(ResponseStore {
            db: Box::new(sqlite::Sqlite::in_memory(owner)?),
            limits,
        })
    }

    /// The limits this store enforces.
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// The store as the log names it (a path, or the URL without its password).
    pub fn describe(&self) -> String {
        self.db.describe()
    }

    /// This server's owner tag (written beside the responses it has not finished).
    pub fn owner(&self) -> &str {
        self.db.owner()
    }

    /// The owner column for a response in `status`.
    fn owner_for(&self, status: &str) -> Option<String> {
        UNFINISHED
            .contains(&status)
            .then(|| self.db.owner().to_string())
    }

    /// Writes (or replaces) a response, then evicts what is over the limits at `now` (unix
    /// seconds), all in one transaction. Returns how many other responses were evicted.
    pub fn put(&self, stored: &StoredResponse, now: u64) -> Result<u64, StoreError> {
        let id = stored.id()?;
        let status = stored.status()?;
        let created_at = stored
            .response
            .get("created_at")
            .and_then(Value::as_u64)
            .unwrap_or(now);
        let response = stored.response.to_string();
        let input_items = Value::Array(stored.input_items.clone()).to_string();
        let context = Value::Array(stored.context.clone()).to_string();
        let owner = self.owner_for(status);
        let limits = self.limits;
        transaction(self.db.as_ref(), |tx| {
            tx.execute(
                "DELETE FROM tokenmill_responses WHERE id = $1",
                &[Param::Text(id)],
            )?;
            let owner = owner.as_deref();
            let insert = "INSERT INTO tokenmill_responses
                 (id, created_at, seq, status, owner, response, input_items, context)
                 VALUES ($1, $2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM tokenmill_responses),
                         $3, $4, $5, $6, $7)";
            let insert_unowned = "INSERT INTO tokenmill_responses
                 (id, created_at, seq, status, owner, response, input_items, context)
                 VALUES ($1, $2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM tokenmill_responses),
                         $3, NULL, $4, $5, $6)";
            match owner {
                Some(owner) => tx.execute(
                    insert,
                    &[
                        Param::Text(id),
                        Param::Int(int(created_at)),
                        Param::Text(status),
                        Param::Text(owner),
                        Param::Text(&response),
                        Param::Text(&input_items),
                        Param::Text(&context),
                    ],
                )?,
                None => tx.execute(
                    insert_unowned,
                    &[
                        Param::Text(id),
                        Param::Int(int(created_at)),
                        Param::Text(status),
                        Param::Text(&response),
                        Param::Text(&input_items),
                        Param::Text(&context),
                    ],
                )?,
            };
            evict(tx, limits, now, Some(id))
        })
    }

    /// Replaces the response object of a stored response (a status change); `false` when
    /// there is no such response (deleted or evicted meanwhile).
    pub fn update_response(&self, response: &Value) -> Result<bool, StoreError> {
        let id = response
            .get("id")
            .and_then(Value::as_str)
            .ok_or(StoreError::MissingField("id"))?;
        let status = response
            .get("status")
            .and_then(Value::as_str)
            .ok_or(StoreError::MissingField("status"))?;
        let text = response.to_string();
        let finished = self.owner_for(status).is_none();
        let changed = transaction(self.db.as_ref(), |tx| {
            let sql = if finished {
                "UPDATE tokenmill_responses SET status = $2, response = $3, owner = NULL
                 WHERE id = $1"
            } else {
                "UPDATE tokenmill_responses SET status = $2, response = $3 WHERE id = $1"
            };
            tx.execute(
                sql,
                &[Param::Text(id), Param::Text(status), Param::Text(&text)],
            )
        })?;
        Ok(changed > 0)
    }

    /// A stored response.
    pub fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let rows = transaction(self.db.as_ref(), |tx| {
            tx.query(
                "SELECT response, input_items, context FROM tokenmill_responses WHERE id = $1",
                &[Param::Text(id)],
            )
        })?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let mut cells = row.into_iter();
        let mut next = || {
            cells
                .next()
                .unwrap_or(Cell::Null)
                .into_text()
                .and_then(|text| Ok(serde_json::from_str::<Value>(&text)?))
        };
        let response = next()?;
        let input_items = serde_json::from_value(next()?)?;
        let context = serde_json::from_value(next()?)?;
        Ok(Some(StoredResponse {
            response,
            input_items,
            context,
        }))
    }

    /// Deletes a response; `false` when there was none.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = transaction(self.db.as_ref(), |tx| {
            tx.execute(
                "DELETE FROM tokenmill_responses WHERE id = $1",
                &[Param::Text(id)],
            )
        })?;
        Ok(deleted > 0)
    }

    /// A page of a response's input items (OpenAI's pagination: `after` an item id, at most
    /// `limit`, in `order`); `None` when there is no such response. An `after` that names no
    /// item of the response starts at the beginning.
    pub fn input_items(
        &self,
        id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Option<ItemPage>, StoreError> {
        let Some(stored) = self.get(id)? else {
            return Ok(None);
        };
        let mut items = stored.input_items;
        if order == Order::Desc {
            items.reverse();
        }
        let start = after
            .and_then(|after| {
                items
                    .iter()
                    .position(|item| item.get("id").and_then(Value::as_str) == Some(after))
            })
            .map_or(0, |position| position + 1);
        let rest = items.len().saturating_sub(start);
        let data: Vec<Value> = items.into_iter().skip(start).take(limit).collect();
        Ok(Some(ItemPage {
            has_more: rest > data.len(),
            data,
        }))
    }

    /// Marks `failed` (with `message`) every response still `queued` or `in_progress` whose
    /// server is gone: one that no longer holds its owner lock, or an unowned one. This
    /// server's own runs and those of other live servers sharing the store are left alone.
    /// Returns the ids it failed.
    pub fn recover_unfinished(&self, message: &str) -> Result<Vec<String>, StoreError> {
        let own = self.db.owner().to_string();
        let owners: BTreeSet<Option<String>> = transaction(self.db.as_ref(), |tx| {
            tx.query(
                "SELECT DISTINCT owner FROM tokenmill_responses WHERE status IN ($1, $2)",
                &[Param::Text(UNFINISHED[0]), Param::Text(UNFINISHED[1])],
            )
        })?
        .into_iter()
        .map(|row| row.first().and_then(Cell::as_text).map(str::to_string))
        .collect();
        let mut dead = BTreeSet::new();
        for owner in owners {
            match owner {
                Some(owner) if owner == own => {}
                Some(owner) => {
                    if !self.db.owner_alive(&owner)? {
                        dead.insert(Some(owner));
                    }
                }
                None => {
                    dead.insert(None);
                }
            }
        }
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        transaction(self.db.as_ref(), |tx| {
            let rows = tx.query(
                "SELECT id, owner, response FROM tokenmill_responses WHERE status IN ($1, $2)",
                &[Param::Text(UNFINISHED[0]), Param::Text(UNFINISHED[1])],
            )?;
            let mut ids = Vec::new();
            for row in rows {
                let [id, owner, response] = <[Cell; 3]>::try_from(row)
                    .map_err(|row| StoreError::Column(format!("{} columns", row.len())))?;
                let owner = owner.as_text().map(str::to_string);
                if !dead.contains(&owner) {
                    continue;
                }
                let id = id.into_text()?;
                let mut response: Value = serde_json::from_str(&response.into_text()?)?;
                if let Some(object) = response.as_object_mut() {
                    object.insert("status".into(), Value::String("failed".into()));
                    object.insert(
                        "error".into(),
                        serde_json::json!({"code": "server_error", "message": message}),
                    );
                }
                tx.execute(
                    "UPDATE tokenmill_responses SET status = 'failed', owner = NULL, response = $2
                     WHERE id = $1",
                    &[Param::Text(&id), Param::Text(&response.to_string())],
                )?;
                ids.push(id);
            }
            Ok(ids)
        })
    }

    /// Evicts what is over the limits at `now` (unix seconds); returns how many went.
    pub fn evict(&self, now: u64) -> Result<u64, StoreError> {
        let limits = self.limits;
        transaction(self.db.as_ref(), |tx| evict(tx, limits, now, None))
    }

    /// How many responses are stored.
    pub fn len(&self) -> Result<u64, StoreError> {
        let rows = transaction(self.db.as_ref(), |tx| {
            tx.query("SELECT COUNT(*) FROM tokenmill_responses", &[])
        })?;
        let count = rows
            .first()
            .and_then(|row| row.first())
            .map_or(Ok(0), Cell::as_int)?;
        Ok(count.max(0) as u64)
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}

/// Deletes expired rows, then the oldest beyond the count limit (never `keep`, the row just
/// written).
fn evict(
    tx: &mut dyn Tx,
    limits: StoreLimits,
    now: u64,
    keep: Option<&str>,
) -> Result<u64, StoreError> {
    let keep = keep.unwrap_or("");
    let mut evicted = 0u64;
    if let Some(ttl) = limits.ttl {
        let cutoff = int(now.saturating_sub(ttl.as_secs()));
        evicted += tx.execute(
            "DELETE FROM tokenmill_responses WHERE created_at < $1 AND id != $2",
            &[Param::Int(cutoff), Param::Text(keep)],
        )?;
    }
    if let Some(max) = limits.max_entries {
        let count = tx
            .query("SELECT COUNT(*) FROM tokenmill_responses", &[])?
            .first()
            .and_then(|row| row.first())
            .map_or(Ok(0), Cell::as_int)?;
        let over = count.saturating_sub(int(max));
        if over > 0 {
            evicted += tx.execute(
                "DELETE FROM tokenmill_responses WHERE id IN (
                     SELECT id FROM tokenmill_responses WHERE id != $2
                     ORDER BY created_at ASC, seq ASC LIMIT $1)",
                &[Param::Int(over), Param::Text(keep)],
            )?;
        }
    }
    Ok(evicted)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn response(id: &str, created_at: u64, status: &str) -> StoredResponse {
        let items: Vec<Value> = (0..5)
            .map(|i| json!({"type": "message", "id": format!("{id}_item{i}"), "role": "user"}))
            .collect();
        StoredResponse::new(
            json!({"id": id, "created_at": created_at, "status": status, "output": []}),
            items.clone(),
            items,
        )
    }

    #[test]
    fn put_get_delete_round_trip() {
        let store = ResponseStore::in_memory(StoreLimits::default()).unwrap();
        let stored = response("resp_a", 5, "completed");
        assert_eq!(store.put(&stored, 5).unwrap(), 0);
        assert_eq!(store.get("resp_a").unwrap(), Some(stored));
        assert_eq!(store.get("resp_b").unwrap(), None);
        assert!(store.delete("resp_a").unwrap());
        assert!(!store.delete("resp_a").unwrap());
        assert!(store.is_empty().unwrap());
    }

    #[test]
    fn input_items_paginate_as_openai() {
        let store = ResponseStore::in_memory(StoreLimits::default()).unwrap();
        store.put(&response("r", 1, "completed"), 1).unwrap();
        let ids = |page: &ItemPage| -> Vec<String> {
            page.data
                .iter()
                .map(|item| item["id"].as_str().unwrap().to_string())
                .collect()
        };
        let first = store
            .input_items("r", None, 2, Order::Asc)
            .unwrap()
            .unwrap();
        assert_eq!(ids(&first), ["r_item0", "r_item1"]);
        assert!(first.has_more);
        let next = store
            .input_items("r", Some("r_item1"), 2, Order::Asc)
            .unwrap()
            .unwrap();
        assert_eq!(ids(&next), ["r_item2", "r_item3"]);
        let last = store
            .input_items("r", Some("r_item3"), 2, Order::Asc)
            .unwrap()
            .unwrap();
        assert_eq!((ids(&last), last.has_more), (vec!["r_item4".into()], false));
        let desc = store
            .input_items("r", None, 3, Order::Desc)
            .unwrap()
            .unwrap();
        assert_eq!(ids(&desc), ["r_item4", "r_item3", "r_item2"]);
        assert_eq!(store.input_items("x", None, 3, Order::Asc).unwrap(), None);
    }

    #[test]
    fn eviction_by_count_and_age() {
        let limits = StoreLimits {
            ttl: Some(Duration::from_secs(100)),
            max_entries: Some(3),
        };
        let store = ResponseStore::in_memory(limits).unwrap();
        for i in 0..3 {
            assert_eq!(
                store
                    .put(&response(&format!("r{i}"), 1000 + i, "completed"), 1000)
                    .unwrap(),
                0
            );
        }
        // A fourth evicts the oldest.
        assert_eq!(
            store.put(&response("r3", 1003, "completed"), 1003).unwrap(),
            1
        );
        assert!(store.get("r0").unwrap().is_none());
        assert_eq!(store.len().unwrap(), 3);
        // Past the TTL, all but the one being written go.
        assert_eq!(
            store.put(&response("r4", 1200, "completed"), 1200).unwrap(),
            3
        );
        assert_eq!(store.len().unwrap(), 1);
        assert_eq!(store.evict(1400).unwrap(), 1);
    }

    #[test]
    fn unfinished_runs_fail_after_a_restart_and_rows_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/responses.sqlite3");
        {
            let store = ResponseStore::open(&path, StoreLimits::default()).unwrap();
            store.put(&response("done", 1, "completed"), 1).unwrap();
            store
                .put(&response("running", 2, "in_progress"), 2)
                .unwrap();
            store.put(&response("waiting", 3, "queued"), 3).unwrap();
            let mut cancelled = response("waiting", 3, "cancelled").response;
            cancelled["output"] = json!([{"type": "message"}]);
            // A status change is visible as a whole.
            assert!(store.update_response(&cancelled).unwrap());
            assert_eq!(store.get("waiting").unwrap().unwrap().response, cancelled);
            store.put(&response("waiting", 3, "queued"), 3).unwrap();
        }
        let store = ResponseStore::open(&path, StoreLimits::default()).unwrap();
        let mut failed = store.recover_unfinished("restarted").unwrap();
        failed.sort();
        assert_eq!(failed, ["running", "waiting"]);
        let running = store.get("running").unwrap().unwrap().response;
        assert_eq!(running["status"], "failed");
        assert_eq!(running["error"]["message"], "restarted");
        assert_eq!(
            store.get("done").unwrap().unwrap().response["status"],
            "completed"
        );
        assert!(store.recover_unfinished("again").unwrap().is_empty());
    }

    #[test]
    fn a_response_without_an_id_is_refused() {
        let store = ResponseStore::in_memory(StoreLimits::default()).unwrap();
        let bad = StoredResponse::new(json!({"status": "completed"}), vec![], vec![]);
        assert!(matches!(
            store.put(&bad, 0),
            Err(StoreError::MissingField("id"))
        ));
    }
}
