//! The `/v1/responses` store flags: `--responses-store`, `--responses-store-ttl`,
//! `--responses-store-max-entries`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokenmill_response_store::{ResponseStore, StoreLimits};

/// OpenAI keeps stored responses 30 days.
const DEFAULT_TTL_SECONDS: u64 = 30 * 24 * 3600;
const DEFAULT_MAX_ENTRIES: u64 = 100_000;

#[derive(Debug, Args)]
pub struct ResponsesArgs {
    /// Where /v1/responses stores responses (`store: true`, the default) for
    /// `previous_response_id`, GET, DELETE and input_items: a SQLite file (servers on one host
    /// may share it), a `postgres://user:password@host:port/db` URL (replicas on several hosts
    /// share it), or `none` to store nothing. Default: $TOKENMILL_STATE_DIR/responses.sqlite3,
    /// else $XDG_CACHE_HOME/tokenmill/responses.sqlite3, else ~/.cache/tokenmill/responses.sqlite3.
    #[arg(long, value_name = "PATH|URL|none", help_heading = "Responses API")]
    pub responses_store: Option<String>,
    /// Seconds a stored response is kept (evictions counted in
    /// tokenmill_responses_store_evictions_total); 0 keeps them until evicted by count.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TTL_SECONDS, help_heading = "Responses API")]
    pub responses_store_ttl: u64,
    /// At most this many stored responses (the oldest are evicted first); 0: no bound.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ENTRIES, help_heading = "Responses API")]
    pub responses_store_max_entries: u64,
}

/// The default store file.
fn default_path() -> Option<PathBuf> {
    let env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = env("TOKENMILL_STATE_DIR") {
        return Some(dir.join("responses.sqlite3"));
    }
    let cache = env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|home| home.join(".cache")))?;
    Some(cache.join("tokenmill").join("responses.sqlite3"))
}

impl ResponsesArgs {
    /// Opens the store (unfinished responses of an earlier run are marked failed), or
    /// `None` for `--responses-store none`.
    pub fn open(&self) -> anyhow::Result<Option<Arc<ResponseStore>>> {
        let limits = StoreLimits {
            ttl: (self.responses_store_ttl > 0)
                .then(|| Duration::from_secs(self.responses_store_ttl)),
            max_entries: (self.responses_store_max_entries > 0)
                .then_some(self.responses_store_max_entries),
        };
        let store = match self.responses_store.as_deref() {
            Some("none") => {
                tracing::info!("responses store: off (--responses-store none)");
                return Ok(None);
            }
            Some(url) if ResponseStore::is_database_url(url) => {
                let store = ResponseStore::connect(url, limits);
                // The error may quote the URL: name the store by its redacted form.
                store.map_err(|e| anyhow::anyhow!("--responses-store: {e}"))?
            }
            location => {
                let path = match location {
                    Some(path) => PathBuf::from(path),
                    None => default_path().context(
                        "no default --responses-store: set TOKENMILL_STATE_DIR or HOME, or \
                         pass --responses-store PATH|URL|none",
                    )?,
                };
                ResponseStore::open(&path, limits)
                    .with_context(|| format!("--responses-store {}", path.display()))?
            }
        };
        let failed = store.recover_unfinished(tokenmill_server::INTERRUPTED_RUN_MESSAGE)?;
        if !failed.is_empty() {
            tracing::warn!(
                "responses store: {} unfinished response(s) of an earlier run marked failed",
                failed.len()
            );
        }
        tracing::info!("responses store: {}", store.describe());
        Ok(Some(Arc::new(store)))
    }
}
