//! The served LoRA adapters: names (what a request's `model` field says), the adapters'
//! ids (what the scheduler and the block hash see) and their loaded weights.
//!
//! At most `max_cpu_loras` adapters are kept in memory; past that the least recently used
//! one's weights are dropped (its name stays registered) and read again from its path when
//! a request names it. A request holds its adapter's `Arc`, so unloading or evicting an
//! adapter never disturbs requests already in flight.

use std::collections::BTreeMap;
use std::path::PathBuf;
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
}

impl LoraConfig {
    /// vLLM's defaults: 1 adapter per batch, rank up to 16.
    pub fn new() -> LoraConfig {
        LoraConfig {
            max_loras: 1,
            max_lora_rank: 16,
            max_cpu_loras: None,
            modules: Vec::new(),
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
    inner: Mutex<Inner>,
}

impl LoraRegistry {
    /// An empty registry for adapters over `model`; `config.modules` are not loaded here
    /// (see [`LoraRegistry::load_modules`]).
    pub fn new(model: ModelConfig, config: LoraConfig) -> Result<LoraRegistry, EngineError> {
        let max_cpu_loras = config.validate()?;
        Ok(LoraRegistry {
            model,
            config,
            max_cpu_loras,
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
