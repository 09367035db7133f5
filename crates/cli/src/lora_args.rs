//! vLLM's LoRA serving flags: `--enable-lora`, `--lora-modules`, `--max-loras`,
//! `--max-lora-rank`, `--max-cpu-loras`, and runtime loading
//! (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=true` or `--allow-runtime-lora-updating`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use tokenmill_engine::{LoraConfig, LoraModule};

#[derive(Debug, Clone, Default, Args)]
pub struct LoraArgs {
    /// Serve LoRA adapters over the model, chosen per request by `model`.
    #[arg(long, help_heading = "LoRA")]
    pub enable_lora: bool,
    /// Adapters served from start-up: `name=path` or JSON
    /// `{"name": ..., "path": ..., "base_model_name": ...}`; a PEFT directory or a GGUF LoRA file.
    #[arg(long, num_args = 1.., value_name = "MODULE", help_heading = "LoRA")]
    pub lora_modules: Vec<String>,
    /// Most distinct adapters in one running batch; requests for others wait.
    #[arg(long, value_name = "N", help_heading = "LoRA")]
    pub max_loras: Option<usize>,
    /// Largest adapter rank accepted.
    #[arg(long, value_name = "R", help_heading = "LoRA")]
    pub max_lora_rank: Option<usize>,
    /// Adapters kept in memory (default: --max-loras); the least recently used are read
    /// again from disk on use.
    #[arg(long, value_name = "N", help_heading = "LoRA")]
    pub max_cpu_loras: Option<usize>,
    /// Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (as
    /// VLLM_ALLOW_RUNTIME_LORA_UPDATING=true does).
    #[arg(long, help_heading = "LoRA")]
    pub allow_runtime_lora_updating: bool,
    /// Directories POST /v1/load_lora_adapter may read adapters under, besides the
    /// directories holding --lora-modules; any other path is refused.
    #[arg(long, num_args = 1.., value_name = "DIR", help_heading = "LoRA")]
    pub allowed_lora_root: Vec<PathBuf>,
}

/// vLLM's JSON form of one `--lora-modules` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonModule {
    name: String,
    path: PathBuf,
    #[serde(default)]
    base_model_name: Option<String>,
}

impl LoraArgs {
    /// The engine's LoRA configuration (`None` without `--enable-lora`); LoRA flags without
    /// it are refused rather than ignored.
    pub fn to_config(&self) -> anyhow::Result<Option<LoraConfig>> {
        if !self.enable_lora {
            let given = [
                ("--lora-modules", !self.lora_modules.is_empty()),
                ("--max-loras", self.max_loras.is_some()),
                ("--max-lora-rank", self.max_lora_rank.is_some()),
                ("--max-cpu-loras", self.max_cpu_loras.is_some()),
                (
                    "--allow-runtime-lora-updating",
                    self.allow_runtime_lora_updating,
                ),
                ("--allowed-lora-root", !self.allowed_lora_root.is_empty()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
                bail!("{flag} needs --enable-lora");
            }
            return Ok(None);
        }
        let mut config = LoraConfig::new();
        if let Some(max_loras) = self.max_loras {
            config.max_loras = max_loras;
        }
        if let Some(rank) = self.max_lora_rank {
            config.max_lora_rank = rank;
        }
        config.max_cpu_loras = self.max_cpu_loras;
        config.allowed_roots = self.allowed_lora_root.clone();
        config.modules = self
            .lora_modules
            .iter()
            .map(|module| parse_module(module))
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(config))
    }

    /// Whether the runtime load/unload routes are served: the flag, or vLLM's variable.
    pub fn runtime_updating(&self) -> bool {
        let from_env = std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
            .is_ok_and(|value| matches!(value.to_ascii_lowercase().as_str(), "1" | "true"));
        self.enable_lora && (self.allow_runtime_lora_updating || from_env)
    }
}

fn parse_module(text: &str) -> anyhow::Result<LoraModule> {
    let text = text.trim();
    if text.starts_with('{') {
        let module: JsonModule = serde_json::from_str(text).with_context(|| {
            format!(
                "--lora-modules {text}: expected {{\"name\": ..., \"path\": ..., \
                 \"base_model_name\": ...}}"
            )
        })?;
        return Ok(LoraModule {
            name: module.name,
            path: module.path,
            base_model_name: module.base_model_name,
        });
    }
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok(LoraModule {
            name: name.to_string(),
            path: PathBuf::from(path),
            base_model_name: None,
        }),
        _ => bail!("--lora-modules {text}: expected name=path or a JSON object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(modules: &[&str]) -> LoraArgs {
        LoraArgs {
            enable_lora: true,
            lora_modules: modules.iter().map(|m| m.to_string()).collect(),
            ..LoraArgs::default()
        }
    }

    #[test]
    fn both_module_forms_parse() {
        let config = args(&[
            "sql=/adapters/sql",
            r#"{"name": "chat", "path": "/a/chat.gguf", "base_model_name": "base"}"#,
        ])
        .to_config()
        .unwrap()
        .unwrap();
        assert_eq!(config.max_loras, 1);
        assert_eq!(config.max_lora_rank, 16);
        assert_eq!(config.modules[0].name, "sql");
        assert_eq!(config.modules[0].path, PathBuf::from("/adapters/sql"));
        assert_eq!(config.modules[1].base_model_name.as_deref(), Some("base"));
    }

    #[test]
    fn malformed_modules_and_flags_without_enable_lora_are_refused() {
        for bad in [
            "noequals",
            "=path",
            r#"{"name": "x"}"#,
            r#"{"name":"x","path":"p","rank":2}"#,
        ] {
            assert!(args(&[bad]).to_config().is_err(), "{bad}");
        }
        let off = LoraArgs {
            max_loras: Some(2),
            ..LoraArgs::default()
        };
        let error = off.to_config().unwrap_err().to_string();
        assert!(error.contains("--max-loras needs --enable-lora"), "{error}");
        let off = LoraArgs {
            allowed_lora_root: vec![PathBuf::from("/srv/adapters")],
            ..LoraArgs::default()
        };
        let error = off.to_config().unwrap_err().to_string();
        assert!(
            error.contains("--allowed-lora-root needs --enable-lora"),
            "{error}"
        );
        let on = LoraArgs {
            allowed_lora_root: vec![PathBuf::from("/srv/adapters")],
            ..args(&[])
        };
        let config = on.to_config().unwrap().unwrap();
        assert_eq!(config.allowed_roots, vec![PathBuf::from("/srv/adapters")]);
        assert!(LoraArgs::default().to_config().unwrap().is_none());
    }
}
