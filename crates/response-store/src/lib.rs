//! tokenmill-response-store: where the Responses API (`/v1/responses`) keeps what it stored.
//!
//! # Design
//!
//! One SQLite file (bundled SQLite through `rusqlite`, WAL journal), one row per response:
//! the response object as JSON, the input items of its own request and its *context* (every
//! item rendered before its output: the previous responses' context, their output and this
//! request's input), so continuing a conversation by `previous_response_id` is one read.
//! Every write is one transaction, so a crash never leaves a half-written response readable.
//!
//! The store is bounded by age (`ttl`) and count (`max_entries`): each [`ResponseStore::put`]
//! evicts in the same transaction and returns how many rows went (the server counts them in
//! a metric). A response that was `queued` or `in_progress` when its server died is marked
//! `failed` by [`ResponseStore::recover_unfinished`] at the next start, so none stays
//! unfinished forever. A store file belongs to one server process at a time.
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

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

/// What can go wrong with the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("response store database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("response store: cannot create {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("response store: a stored row is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("response store: a response object needs a string `{0}`")]
    MissingField(&'static str),
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

/// The SQLite-backed store.
#[derive(Debug)]
pub struct ResponseStore {
    conn: Mutex<Connection>,
    limits: StoreLimits,
}

impl ResponseStore {
    /// Opens (creating it and its folder if needed) the store file at `path`.
    pub fn open(path: &Path, limits: StoreLimits) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                path: parent.display().to_string(),
                source,
            })?;
        }
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        Self::with_connection(conn, limits)
    }

    /// A store that lives only as long as the process (tests, `--responses-store none`
    /// never uses it).
    pub fn in_memory(limits: StoreLimits) -> Result<Self, StoreError> {
        Self::with_connection(Connection::open_in_memory()?, limits)
    }

    fn with_connection(conn: Connection, limits: StoreLimits) -> Result<Self, StoreError> {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS responses (
                 id TEXT PRIMARY KEY,
                 created_at INTEGER NOT NULL,
                 status TEXT NOT NULL,
                 response TEXT NOT NULL,
                 input_items TEXT NOT NULL,
                 context TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS responses_created_at ON responses (created_at);",
        )?;
        Ok(ResponseStore {
            conn: Mutex::new(conn),
            limits,
        })
    }

    fn conn(&self) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| StoreError::Poisoned)
    }

    /// The limits this store enforces.
    pub fn limits(&self) -> StoreLimits {
        self.limits
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
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT OR REPLACE INTO responses (id, created_at, status, response, input_items, context)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                id,
                created_at as i64,
                status,
                stored.response.to_string(),
                Value::Array(stored.input_items.clone()).to_string(),
                Value::Array(stored.context.clone()).to_string(),
            ],
        )?;
        let evicted = evict(&tx, self.limits, now, Some(id))?;
        tx.commit()?;
        Ok(evicted)
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
        let changed = self.conn()?.execute(
            "UPDATE responses SET status = ?2, response = ?3 WHERE id = ?1",
            params![id, status, response.to_string()],
        )?;
        Ok(changed > 0)
    }

    /// A stored response.
    pub fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let conn = self.conn()?;
        let row = conn
            .query_row(
                "SELECT response, input_items, context FROM responses WHERE id = ?1",
                params![id],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                },
            )
            .optional()?;
        let Some((response, input_items, context)) = row else {
            return Ok(None);
        };
        Ok(Some(StoredResponse {
            response: serde_json::from_str(&response)?,
            input_items: serde_json::from_str(&input_items)?,
            context: serde_json::from_str(&context)?,
        }))
    }

    /// Deletes a response; `false` when there was none.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = self
            .conn()?
            .execute("DELETE FROM responses WHERE id = ?1", params![id])?;
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

    /// Marks every response still `queued` or `in_progress` as `failed` with `message` (a
    /// server that died left them); returns their ids.
    pub fn recover_unfinished(&self, message: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let rows: Vec<(String, String)> = {
            let mut statement =
                tx.prepare("SELECT id, response FROM responses WHERE status IN (?1, ?2)")?;
            let rows = statement.query_map(params![UNFINISHED[0], UNFINISHED[1]], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let mut ids = Vec::with_capacity(rows.len());
        for (id, response) in rows {
            let mut response: Value = serde_json::from_str(&response)?;
            if let Some(object) = response.as_object_mut() {
                object.insert("status".into(), Value::String("failed".into()));
                object.insert(
                    "error".into(),
                    serde_json::json!({"code": "server_error", "message": message}),
                );
            }
            tx.execute(
                "UPDATE responses SET status = 'failed', response = ?2 WHERE id = ?1",
                params![id, response.to_string()],
            )?;
            ids.push(id);
        }
        tx.commit()?;
        Ok(ids)
    }

    /// Evicts what is over the limits at `now` (unix seconds); returns how many went.
    pub fn evict(&self, now: u64) -> Result<u64, StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let evicted = evict(&tx, self.limits, now, None)?;
        tx.commit()?;
        Ok(evicted)
    }

    /// How many responses are stored.
    pub fn len(&self) -> Result<u64, StoreError> {
        let count: i64 = self
            .conn()?
            .query_row("SELECT COUNT(*) FROM responses", [], |row| row.get(0))?;
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
    tx: &rusqlite::Transaction<'_>,
    limits: StoreLimits,
    now: u64,
    keep: Option<&str>,
) -> Result<u64, StoreError> {
    let keep = keep.unwrap_or("");
    let mut evicted = 0u64;
    if let Some(ttl) = limits.ttl {
        let cutoff = now.saturating_sub(ttl.as_secs()) as i64;
        evicted += tx.execute(
            "DELETE FROM responses WHERE created_at < ?1 AND id != ?2",
            params![cutoff, keep],
        )? as u64;
    }
    if let Some(max) = limits.max_entries {
        let count: i64 = tx.query_row("SELECT COUNT(*) FROM responses", [], |row| row.get(0))?;
        let over = count.saturating_sub(i64::try_from(max).unwrap_or(i64::MAX));
        if over > 0 {
            evicted += tx.execute(
                "DELETE FROM responses WHERE id IN (
                     SELECT id FROM responses WHERE id != ?2
                     ORDER BY created_at ASC, rowid ASC LIMIT ?1)",
                params![over, keep],
            )? as u64;
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
