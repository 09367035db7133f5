//! The served LoRA adapters: names (what a request's `model` field says), the adapters'
//! ids (what the scheduler and the block hash see) and their loaded weights.
//!
//! At most `max_cpu_loras` adapters are kept in memory; past that the least recently used
//! one's weights are dropped (its name stays registered) and read again from its path when
//! a request names it. A request holds its adapter's `Arc`, so unloading or evicting an
//! adapter never disturbs requests already in flight.
//!
//! A runtime load (`/v1/load_lora_adapter`, [`LoraRegistry::load_at_runtime`]) reads only
//! under the allowed roots (`--allowed-lora-root`, and the directories holding the
//! `--lora-modules` entries), after resolving symlinks, and only regular files; every path that
//! is outside them, missing, not a regular file or not a readable adapter gets the same answer,
//! so the route is no oracle for what exists on the server nor a reader of its files. The
//! reason goes to the log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokenmill_models::{LoraAdapter, ModelConfig};

use crate::EngineError;

/// `--enable-lora` and its limits, plus the adapters served from start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Most distinct adapters in one running batch (`--max-loras`).
    pub max_loras: usize,
    /// Largest rank accepted (`--max-lora-rank`).
    pub max_lora_rank: usize,
    /// Adapters kept loaded (`--max-cpu-loras`; `None`: `max_loras`, vLLM's default).
    pub max_cpu_loras: Option<usize>,
    /// `--lora-modules`.
    pub modules: Vec<LoraModule>,
    /// `--allowed-lora-root`: directories runtime loads may read under, besides the
    /// directories holding `modules`.
    pub allowed_roots: Vec<PathBuf>,
}

impl LoraConfig {
    /// vLLM's defaults: 1 adapter per batch, rank up to 16.
    pub fn new() -> LoraConfig {
        LoraConfig {
            max_loras: 1,
            max_lora_rank: 16,
            max_cpu_loras: None,
            modules: Vec::new(),
            allowed_roots: Vec::new(),
        }
    }

    fn validate(&self) -> Result<usize, EngineError> {
        if self.max_loras == 0 {
            return Err(EngineError::Config("--max-loras must be at least 1".into()));
        }
        if self.max_lora_rank == 0 {
            return Err(EngineError::Config(
                "--max-lora-rank must be at least 1".into(),
            ));
        }
        let max_cpu_loras = self.max_cpu_loras.unwrap_or(self.max_loras);
        if max_cpu_loras < self.max_loras {
            return Err(EngineError::Config(format!(
                "--max-cpu-loras ({max_cpu_loras}) must be at least --max-loras ({})",
                self.max_loras
            )));
        }
        Ok(max_cpu_loras)
    }
}

impl Default for LoraConfig {
    fn default() -> LoraConfig {
        LoraConfig::new()
    }
}

/// One `--lora-modules` entry (`name=path` or vLLM's JSON form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: PathBuf,
    /// The `root`/`parent` shown for it in `/v1/models` (`None`: the served model name).
    pub base_model_name: Option<String>,
}

/// What a request that names an adapter carries into the engine.
#[derive(Debug, Clone)]
pub struct LoraRequest {
    /// Unique per registration, never reused; part of every KV block hash.
    pub id: u32,
    pub name: String,
    pub adapter: Arc<LoraAdapter>,
}

/// A registered adapter as `/v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraListing {
    pub name: String,
    pub path: PathBuf,
    pub base_model_name: Option<String>,
    /// Unix seconds of its registration (`created`).
    pub created: u64,
}

#[derive(Debug)]
struct Entry {
    id: u32,
    path: PathBuf,
    base_model_name: Option<String>,
    created: u64,
    /// `None` once evicted; read again on use.
    adapter: Option<Arc<LoraAdapter>>,
    last_used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: BTreeMap<String, Entry>,
    next_id: u32,
    clock: u64,
}

/// The adapters a server can serve, shared by the HTTP handlers.
#[derive(Debug)]
pub struct LoraRegistry {
    model: ModelConfig,
    config: LoraConfig,
    max_cpu_loras: usize,
    /// Canonical directories a runtime load may read under.
    allowed_roots: Vec<PathBuf>,
    inner: Mutex<Inner>,
}

/// The one answer to a runtime load whose path cannot be served (see the module comment).
fn refused_path(path: &Path) -> EngineError {
    EngineError::InvalidRequest(format!(
        "cannot load a LoRA adapter from {}: it is not a readable LoRA adapter (a PEFT \
         directory or a GGUF LoRA file) under this server's allowed LoRA roots \
         (--allowed-lora-root and the directories of --lora-modules)",
        path.display()
    ))
}

impl LoraRegistry {
    /// An empty registry for adapters over `model`; `config.modules` are not loaded here
    /// (see [`LoraRegistry::load_modules`]).
    pub fn new(model: ModelConfig, config: LoraConfig) -> Result<LoraRegistry, EngineError> {
        let max_cpu_loras = config.validate()?;
        let mut allowed_roots = Vec::new();
        for root in &config.allowed_roots {
            let canonical = std::fs::canonicalize(root)
                .ok()
                .filter(|root| root.is_dir())
                .ok_or_else(|| {
                    EngineError::Config(format!(
                        "--allowed-lora-root {}: not a readable directory",
                        root.display()
                    ))
                })?;
            allowed_roots.push(canonical);
        }
        // A module that cannot be resolved fails its own load in `load_modules`.
        allowed_roots.extend(config.modules.iter().filter_map(|module| {
            std::fs::canonicalize(&module.path)
                .ok()
                .and_then(|path| path.parent().map(Path::to_path_buf))
        }));
        Ok(LoraRegistry {
            model,
            config,
            max_cpu_loras,
            allowed_roots,
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
        })
    }

    /// Loads every `--lora-modules` entry; the first that fails is an error naming it.
    pub fn load_modules(&self) -> Result<(), EngineError> {
        for module in &self.config.modules {
            self.load(
                &module.name,
                module.path.clone(),
                module.base_model_name.clone(),
            )
            .map_err(|error| {
                EngineError::Config(format!("--lora-modules {}: {error}", module.name))
            })?;
        }
        Ok(())
    }

    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, EngineError> {
        self.inner
            .lock()
            .map_err(|_| EngineError::Executor("the LoRA registry lock is poisoned".into()))
    }

    /// Reads and registers an adapter under `name`. A name already registered is refused
    /// (vLLM's message), as is anything [`LoraAdapter::load`] refuses; either way the
    /// registered adapters are untouched.
    pub fn load(
        &self,
        name: &str,
        path: PathBuf,
        base_model_name: Option<String>,
    ) -> Result<(), EngineError> {
        if name.is_empty() {
            return Err(EngineError::InvalidRequest(
                "the LoRA adapter name must not be empty".into(),
            ));
        }
        if self.lock()?.entries.contains_key(name) {
            return Err(EngineError::LoraAlreadyLoaded(name.to_string()));
        }
        // Read outside the lock: requests keep resolving names meanwhile.
        let adapter = Arc::new(LoraAdapter::load(
            &path,
            &self.model,
            self.config.max_lora_rank,
        )?);
        let mut inner = self.lock()?;
        if inner.entries.contains_key(name) {
            return Err(EngineError::LoraAlreadyLoaded(name.to_string()));
        }
        let id = inner.next_id;
        inner.next_id = id
            .checked_add(1)
            .ok_or_else(|| EngineError::Config("LoRA adapter ids exhausted".into()))?;
        inner.clock += 1;
        let last_used = inner.clock;
        inner.entries.insert(
            name.to_string(),
            Entry {
                id,
                path,
                base_model_name,
                created: unix_now(),
                adapter: Some(adapter),
                last_used,
            },
        );
        self.evict(&mut inner, name);
        tracing::info!("loaded LoRA adapter {name} (id {id})");
        Ok(())
    }

    /// [`Self::load`] for a path a client sent: read only if it resolves under an allowed
    /// root (and is a regular file or an adapter directory of regular files); any path-level
    /// failure (outside the roots, missing, not a regular file, unreadable, not an adapter)
    /// is one message, its reason logged.
    pub fn load_at_runtime(&self, name: &str, path: &Path) -> Result<(), EngineError> {
        let refuse = |reason: &dyn std::fmt::Display| {
            tracing::warn!(
                "runtime load of LoRA adapter `{name}` from {} refused: {reason}",
                path.display()
            );
            refused_path(path)
        };
        let resolved = self
            .check_runtime_path(path)
            .map_err(|reason| refuse(&reason))?;
        match self.load(name, resolved, None) {
            Err(EngineError::Lora(error)) if error.is_unreadable() => Err(refuse(&error)),
            other => other,
        }
    }

    /// The canonical form of `path` when it lies under an allowed root (for an adapter
    /// directory, its two files too, so neither is a symlink out), else why not. That every
    /// file is a regular one is [`LoraAdapter::load`]'s check (a FIFO is never opened).
    fn check_runtime_path(&self, path: &Path) -> Result<PathBuf, String> {
        let allowed = |candidate: &Path| -> Result<PathBuf, String> {
            let resolved = std::fs::canonicalize(candidate)
                .map_err(|error| format!("{}: {error}", candidate.display()))?;
            if !self
                .allowed_roots
                .iter()
                .any(|root| resolved.starts_with(root))
            {
                return Err(format!(
                    "{} is outside the allowed roots {:?}",
                    resolved.display(),
                    self.allowed_roots
                ));
            }
            Ok(resolved)
        };
        let resolved = allowed(path)?;
        if resolved.is_dir() {
            for file in ["adapter_config.json", "adapter_model.safetensors"] {
                allowed(&resolved.join(file))?;
            }
        }
        Ok(resolved)
    }

    /// Forgets `name`. Requests already using it finish with it.
    pub fn unload(&self, name: &str) -> Result<(), EngineError> {
        match self.lock()?.entries.remove(name) {
            Some(_) => {
                tracing::info!("unloaded LoRA adapter {name}");
                Ok(())
            }
            None => Err(EngineError::LoraNotFound(name.to_string())),
        }
    }

    /// The adapter registered as `name`, read again if it was evicted; `Ok(None)` when no
    /// adapter has that name.
    pub fn get(&self, name: &str) -> Result<Option<LoraRequest>, EngineError> {
        let mut inner = self.lock()?;
        inner.clock += 1;
        let clock = inner.clock;
        let Some(entry) = inner.entries.get_mut(name) else {
            return Ok(None);
        };
        entry.last_used = clock;
        let (id, adapter) = match &entry.adapter {
            Some(adapter) => (entry.id, Arc::clone(adapter)),
            None => {
                let adapter = Arc::new(LoraAdapter::load(
                    &entry.path,
                    &self.model,
                    self.config.max_lora_rank,
                )?);
                entry.adapter = Some(Arc::clone(&adapter));
                let id = entry.id;
                self.evict(&mut inner, name);
                (id, adapter)
            }
        };
        Ok(Some(LoraRequest {
            id,
            name: name.to_string(),
            adapter,
        }))
    }

    /// Whether `name` is a registered adapter.
    pub fn contains(&self, name: &str) -> bool {
        self.lock()
            .map(|inner| inner.entries.contains_key(name))
            .unwrap_or(false)
    }

    /// The registered adapters, by name.
    pub fn list(&self) -> Vec<LoraListing> {
        let Ok(inner) = self.lock() else {
            return Vec::new();
        };
        inner
            .entries
            .iter()
            .map(|(name, entry)| LoraListing {
                name: name.clone(),
                path: entry.path.clone(),
                base_model_name: entry.base_model_name.clone(),
                created: entry.created,
            })
            .collect()
    }

    /// How many adapters hold their weights in memory.
    pub fn num_loaded(&self) -> usize {
        self.lock()
            .map(|inner| {
                inner
                    .entries
                    .values()
                    .filter(|e| e.adapter.is_some())
                    .count()
            })
            .unwrap_or(0)
    }

    /// Drops the least recently used adapters' weights (never `keep`'s) until at most
    /// `max_cpu_loras` are in memory.
    fn evict(&self, inner: &mut Inner, keep: &str) {
        loop {
            let loaded = inner
                .entries
                .values()
                .filter(|e| e.adapter.is_some())
                .count();
            if loaded <= self.max_cpu_loras {
                return;
            }
            let victim = inner
                .entries
                .iter_mut()
                .filter(|(name, e)| e.adapter.is_some() && name.as_str() != keep)
                .min_by_key(|(_, e)| e.last_used);
            match victim {
                Some((name, entry)) => {
                    tracing::debug!("evicting LoRA adapter {name} from memory");
                    entry.adapter = None;
                }
                None => return,
            }
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
