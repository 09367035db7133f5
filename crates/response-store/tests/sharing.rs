//! Several servers on one store: a SQLite file shared on one host, and PostgreSQL shared by
//! replicas (the server from `scripts/start-postgres.sh`, `TOKENMILL_TEST_POSTGRES`). A live
//! server's unfinished runs are never failed by another; a dead one's are.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use tokenmill_response_store::{ResponseStore, StoreLimits, StoredResponse};

fn response(id: &str, status: &str) -> StoredResponse {
    let items = vec![json!({"type": "message", "id": format!("{id}_in"), "role": "user"})];
    StoredResponse::new(
        json!({"id": id, "created_at": 100, "status": status, "output": []}),
        items.clone(),
        items,
    )
}

fn status(store: &ResponseStore, id: &str) -> String {
    store.get(id).unwrap().unwrap().response["status"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `open` twice gives two servers on one store; `a` dies (is dropped) midway.
fn live_runs_are_left_alone_and_dead_ones_fail(open: &dyn Fn() -> ResponseStore) {
    let a = open();
    let b = open();
    assert_ne!(a.owner(), b.owner());
    a.put(&response("a_done", "completed"), 100).unwrap();
    a.put(&response("a_running", "in_progress"), 100).unwrap();
    b.put(&response("b_running", "queued"), 100).unwrap();
    // Each sees the other's writes.
    assert_eq!(status(&b, "a_done"), "completed");
    assert_eq!(status(&a, "b_running"), "queued");
    // Both alive: nothing is failed, by either.
    assert!(a.recover_unfinished("x").unwrap().is_empty());
    assert!(b.recover_unfinished("x").unwrap().is_empty());
    // A run that finishes gives up its owner: it is never failed later.
    let mut done = response("b_running", "completed").response;
    done["output"] = json!([{"type": "message"}]);
    assert!(b.update_response(&done).unwrap());
    b.put(&response("b_running2", "in_progress"), 100).unwrap();
    drop(a);
    // The database may take a moment to notice a closed session.
    let deadline = Instant::now() + Duration::from_secs(10);
    let failed = loop {
        let failed = b.recover_unfinished("its server died").unwrap();
        if !failed.is_empty() || Instant::now() > deadline {
            break failed;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(failed, ["a_running"]);
    let a_running = b.get("a_running").unwrap().unwrap().response;
    assert_eq!(a_running["status"], "failed");
    assert_eq!(a_running["error"]["message"], "its server died");
    assert_eq!(status(&b, "b_running"), "completed");
    assert_eq!(status(&b, "b_running2"), "in_progress");
    assert!(b.recover_unfinished("again").unwrap().is_empty());
}

#[test]
fn sqlite_servers_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("responses.sqlite3");
    live_runs_are_left_alone_and_dead_ones_fail(&|| {
        ResponseStore::open(&path, StoreLimits::default()).unwrap()
    });
}

#[test]
fn sqlite_servers_opening_a_fresh_file_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh/responses.sqlite3");
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let store = ResponseStore::open(&path, StoreLimits::default()).unwrap();
                store
                    .put(&response(&format!("r{i}"), "in_progress"), 100)
                    .unwrap();
                assert!(store.recover_unfinished("x").is_ok());
                store
            })
        })
        .collect();
    let stores: Vec<ResponseStore> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(stores[0].len().unwrap(), 8);
    // All eight are alive: none of their runs was failed by another's recovery, and none
    // took another's lock file for a dead server's.
    for i in 0..8 {
        assert_eq!(status(&stores[0], &format!("r{i}")), "in_progress");
    }
    assert_eq!(lock_files(&path), 8);
}

fn lock_files(store: &std::path::Path) -> usize {
    let dir = format!("{}.owners", store.display());
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".lock")
        })
        .count()
}

#[test]
fn sqlite_removes_dead_servers_lock_files_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("responses.sqlite3");
    let first = ResponseStore::open(&path, StoreLimits::default()).unwrap();
    // What a server killed with no unfinished run leaves: its lock file, unlocked.
    std::fs::write(
        dir.path().join("responses.sqlite3.owners/0badc0de.lock"),
        b"",
    )
    .unwrap();
    assert_eq!(lock_files(&path), 2);
    let second = ResponseStore::open(&path, StoreLimits::default()).unwrap();
    // The dead one's file went; the live first server's stayed.
    assert_eq!(lock_files(&path), 2);
    assert!(!dir
        .path()
        .join("responses.sqlite3.owners/0badc0de.lock")
        .exists());
    drop(first);
    drop(second);
    assert_eq!(lock_files(&path), 0);
}

/// A fresh database on the test server, so that tests never see each other's rows.
fn fresh_database(test: &str) -> Option<String> {
    let url = tokenmill_test_assets::postgres_url_or_skip(test)?;
    let name = format!("tm_{}_{:08x}", test, rand_suffix());
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let base = url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base);
    Some(format!("{base}/{name}"))
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id()
}

#[test]
fn postgres_replicas_on_one_database() {
    let Some(url) = fresh_database("replicas") else {
        return;
    };
    live_runs_are_left_alone_and_dead_ones_fail(&|| {
        ResponseStore::connect(&url, StoreLimits::default()).unwrap()
    });
}

#[test]
fn postgres_store_evicts_and_paginates_as_sqlite_does() {
    let Some(url) = fresh_database("evicts") else {
        return;
    };
    let limits = StoreLimits {
        ttl: Some(Duration::from_secs(100)),
        max_entries: Some(3),
    };
    // Replicas opening a fresh database at once create its table once.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || ResponseStore::connect(&url, limits).unwrap())
        })
        .collect();
    let stores: Vec<ResponseStore> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let store = &stores[0];
    for i in 0..3u64 {
        let mut r = response(&format!("r{i}"), "completed");
        r.response["created_at"] = json!(1000 + i);
        assert_eq!(stores[i as usize].put(&r, 1000).unwrap(), 0);
    }
    let mut fourth = response("r3", "completed");
    fourth.response["created_at"] = json!(1003);
    assert_eq!(stores[3].put(&fourth, 1003).unwrap(), 1);
    assert!(store.get("r0").unwrap().is_none());
    assert_eq!(store.len().unwrap(), 3);
    let page = store
        .input_items("r3", None, 20, tokenmill_response_store::Order::Asc)
        .unwrap()
        .unwrap();
    assert_eq!(page.data[0]["id"], "r3_in");
    let mut late = response("r4", "completed");
    late.response["created_at"] = json!(1200);
    assert_eq!(store.put(&late, 1200).unwrap(), 3);
    assert!(store.delete("r4").unwrap());
    assert!(store.is_empty().unwrap());
    assert!(ResponseStore::connect("postgres://nobody@127.0.0.1:1/none", limits).is_err());
}
