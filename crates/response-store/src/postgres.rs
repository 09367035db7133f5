//! The PostgreSQL store, for several replicas behind one load balancer: every replica opens
//! the same `postgres://` URL, so a conversation continues by `previous_response_id` on any
//! of them. Each replica holds a session advisory lock on its owner key while it runs; the
//! server drops the lock when its connection dies, so a live replica is one whose key cannot
//! be locked. Every transaction first takes one transaction-scoped advisory lock, so writes
//! from several replicas (eviction by count included) apply one after another.

use std::sync::{Mutex, MutexGuard};

use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};

use crate::backend::{Cell, Database, Param, Tx, SCHEMA};
use crate::StoreError;

/// The advisory lock every store transaction takes (an arbitrary constant: "tokenmil").
const STORE_LOCK: i64 = 0x746f_6b65_6e6d_696c;

pub(crate) struct Postgres {
    url: String,
    client: Mutex<Client>,
    owner: String,
    key: i64,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("url", &redacted(&self.url))
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// The URL without its password.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_string(),
    }
}

/// The owner tag of a lock key and back (hex, as the SQLite store's tags).
fn owner_tag(key: i64) -> String {
    format!("{:016x}", key as u64)
}

fn owner_key(tag: &str) -> Option<i64> {
    (tag.len() == 16)
        .then(|| u64::from_str_radix(tag, 16).ok())
        .flatten()
        .map(|key| key as i64)
}

impl Postgres {
    pub(crate) fn connect(url: &str, key: i64) -> Result<Self, StoreError> {
        let client = Self::session(url, key)?;
        let store = Postgres {
            url: url.to_string(),
            client: Mutex::new(client),
            owner: owner_tag(key),
            key,
        };
        store.in_transaction(&mut |tx| {
            for statement in SCHEMA {
                tx.execute(statement, &[])?;
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// A connection holding this server's liveness lock.
    fn session(url: &str, key: i64) -> Result<Client, StoreError> {
        let mut client = Client::connect(url, NoTls)?;
        client.execute("SELECT pg_advisory_lock($1)", &[&key])?;
        Ok(client)
    }

    /// The connection, opened again (with the lock taken again) if the server dropped it.
    fn client(&self) -> Result<MutexGuard<'_, Client>, StoreError> {
        let mut client = self.client.lock().map_err(|_| StoreError::Poisoned)?;
        if client.is_closed() {
            *client = Self::session(&self.url, self.key)?;
        }
        Ok(client)
    }
}

struct PgTx<'a, 'b>(&'a mut postgres::Transaction<'b>);

/// The parameters as owned values the driver can borrow.
fn owned(params: &[Param<'_>]) -> Vec<Box<dyn ToSql + Sync>> {
    params
        .iter()
        .map(|param| -> Box<dyn ToSql + Sync> {
            match *param {
                Param::Text(text) => Box::new(text.to_string()),
                Param::Int(value) => Box::new(value),
            }
        })
        .collect()
}

fn refs(owned: &[Box<dyn ToSql + Sync>]) -> Vec<&(dyn ToSql + Sync)> {
    owned.iter().map(|param| param.as_ref()).collect()
}

impl Tx for PgTx<'_, '_> {
    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        let params = owned(params);
        Ok(self.0.execute(sql, &refs(&params))?)
    }

    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        let params = owned(params);
        let rows = self.0.query(sql, &refs(&params))?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| {
                        let ty = row.columns()[i].type_();
                        Ok(if *ty == Type::INT8 {
                            row.try_get::<_, Option<i64>>(i)?
                                .map_or(Cell::Null, Cell::Int)
                        } else if *ty == Type::INT4 {
                            row.try_get::<_, Option<i32>>(i)?
                                .map_or(Cell::Null, |v| Cell::Int(v.into()))
                        } else if *ty == Type::BOOL {
                            row.try_get::<_, Option<bool>>(i)?
                                .map_or(Cell::Null, |v| Cell::Int(v.into()))
                        } else {
                            row.try_get::<_, Option<String>>(i)?
                                .map_or(Cell::Null, Cell::Text)
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

impl Database for Postgres {
    fn in_transaction(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut client = self.client()?;
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&STORE_LOCK])?;
        body(&mut PgTx(&mut tx))?;
        tx.commit()?;
        Ok(())
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    fn owner_alive(&self, owner: &str) -> Result<bool, StoreError> {
        let Some(key) = owner_key(owner) else {
            return Ok(false);
        };
        let mut client = self.client()?;
        let row = client.query_one("SELECT pg_try_advisory_lock($1)", &[&key])?;
        let taken: bool = row.try_get(0)?;
        if taken {
            // Nobody held it: that replica is gone. Give the lock back.
            client.execute("SELECT pg_advisory_unlock($1)", &[&key])?;
        }
        Ok(!taken)
    }

    fn describe(&self) -> String {
        redacted(&self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_logged_without_their_password() {
        assert_eq!(
            redacted("postgres://me:secret@db:5432/x"),
            "postgres://me@db:5432/x"
        );
        assert_eq!(redacted("postgres://db/x"), "postgres://db/x");
    }

    #[test]
    fn owner_tags_round_trip() {
        for key in [0, 1, -1, i64::MIN, i64::MAX, STORE_LOCK] {
            assert_eq!(owner_key(&owner_tag(key)), Some(key));
        }
        assert_eq!(owner_key("nothex"), None);
    }
}
