//! `--structured-outputs-config` (vLLM's JSON object; `serve` also takes the dotted
//! `--structured-outputs-config.KEY VALUE` form, see `vllm_flags::normalize_serve_args`).

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{Map, Value};
use tokenmill_models::JsonGrammarOptions;
use tokenmill_text::REASONING_PARSER_NAMES;

/// The keys of vLLM's `StructuredOutputsConfig`.
const KEYS: [&str; 7] = [
    "backend",
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "reasoning_parser",
    "reasoning_parser_plugin",
    "enable_in_reasoning",
];

/// vLLM's backends; tokenmill's is llguidance (`guidance`), which `auto` selects.
const VLLM_BACKENDS: [&str; 5] = [
    "auto",
    "xgrammar",
    "guidance",
    "outlines",
    "lm-format-enforcer",
];

#[derive(Debug, Clone, Default, Args)]
pub struct StructuredOutputsArgs {
    /// JSON: {"backend": "auto"|"guidance", "disable_any_whitespace": bool,
    /// "disable_additional_properties": bool, "reasoning_parser": NAME, "disable_fallback": bool,
    /// "enable_in_reasoning": bool}.
    #[arg(long, value_name = "JSON", help_heading = "Structured outputs")]
    pub structured_outputs_config: Option<String>,
}

/// What `--structured-outputs-config` asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StructuredOutputsConfig {
    pub json: JsonGrammarOptions,
    /// `reasoning_parser` (vLLM >= 0.11 keeps it here; `--reasoning-parser` is the same).
    pub reasoning_parser: Option<String>,
    /// `enable_in_reasoning`, when given.
    pub enable_in_reasoning: Option<bool>,
}

impl StructuredOutputsArgs {
    pub fn config(&self) -> anyhow::Result<StructuredOutputsConfig> {
        let Some(text) = &self.structured_outputs_config else {
            return Ok(StructuredOutputsConfig::default());
        };
        let value: Value = serde_json::from_str(text)
            .with_context(|| format!("--structured-outputs-config is not JSON: {text}"))?;
        let Value::Object(map) = value else {
            bail!("--structured-outputs-config must be a JSON object, got {text}");
        };
        parse(&map)
    }

    /// The reasoning parser from `--reasoning-parser` and this config together (the same
    /// setting under two names: both may be given only if they agree).
    pub fn reasoning_parser(&self, flag: Option<String>) -> anyhow::Result<Option<String>> {
        let config = self.config()?;
        let parser = match (flag, config.reasoning_parser) {
            (Some(flag), Some(key)) if flag != key => bail!(
                "--reasoning-parser {flag} and --structured-outputs-config's reasoning_parser \
                 {key} disagree"
            ),
            (flag, key) => flag.or(key),
        };
        // tokenmill applies a grammar from the first generated token; vLLM's default
        // (`enable_in_reasoning: false`) waits for the reasoning to end, which tokenmill does
        // not do, so asking for it with a reasoning parser is refused rather than ignored.
        if parser.is_some() && config.enable_in_reasoning == Some(false) {
            bail!(
                "--structured-outputs-config: enable_in_reasoning=false is not supported: \
                 tokenmill applies structured outputs from the first token, reasoning included \
                 (enable_in_reasoning=true)"
            );
        }
        Ok(parser)
    }
}

fn parse(map: &Map<String, Value>) -> anyhow::Result<StructuredOutputsConfig> {
    let mut config = StructuredOutputsConfig::default();
    for (key, value) in map {
        let flag = |key: &str| -> anyhow::Result<bool> {
            value.as_bool().with_context(|| {
                format!("--structured-outputs-config: {key} must be true or false, got {value}")
            })
        };
        let text = |key: &str| -> anyhow::Result<&str> {
            value.as_str().with_context(|| {
                format!("--structured-outputs-config: {key} must be a string, got {value}")
            })
        };
        match key.as_str() {
            "backend" => {
                let backend = text(key)?;
                if !VLLM_BACKENDS.contains(&backend) {
                    bail!(
                        "--structured-outputs-config: unknown backend {backend:?} (vLLM's are {})",
                        VLLM_BACKENDS.join(", ")
                    );
                }
                if backend != "auto" && backend != "guidance" {
                    bail!(
                        "--structured-outputs-config: backend {backend:?} is not available: \
                         tokenmill's structured outputs use llguidance (\"guidance\"; \"auto\" \
                         selects it)"
                    );
                }
            }
            // One backend: there is nothing to fall back to either way.
            "disable_fallback" => {
                flag(key)?;
            }
            "disable_any_whitespace" => config.json.any_whitespace = !flag(key)?,
            "disable_additional_properties" => config.json.no_additional_properties = flag(key)?,
            "reasoning_parser" => {
                let name = text(key)?;
                if !name.is_empty() {
                    if !REASONING_PARSER_NAMES.contains(&name) {
                        bail!(
                            "--structured-outputs-config: invalid reasoning parser: {name} \
                             (choose from {{ {} }})",
                            REASONING_PARSER_NAMES.join(",")
                        );
                    }
                    config.reasoning_parser = Some(name.to_string());
                }
            }
            "reasoning_parser_plugin" => {
                if !text(key)?.is_empty() {
                    bail!(
                        "--structured-outputs-config: reasoning_parser_plugin names a Python \
                         module that vLLM imports; tokenmill's reasoning parsers are built in"
                    );
                }
            }
            "enable_in_reasoning" => config.enable_in_reasoning = Some(flag(key)?),
            other => bail!(
                "--structured-outputs-config: unknown key {other:?} (known: {})",
                KEYS.join(", ")
            ),
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(json: &str) -> StructuredOutputsArgs {
        StructuredOutputsArgs {
            structured_outputs_config: Some(json.into()),
        }
    }

    #[test]
    fn vllm_keys_map_onto_the_grammar_options() {
        let config = args(
            r#"{"backend": "guidance", "disable_any_whitespace": true,
                "disable_additional_properties": true, "disable_fallback": true}"#,
        )
        .config()
        .unwrap();
        assert!(!config.json.any_whitespace);
        assert!(config.json.no_additional_properties);
        assert_eq!(
            StructuredOutputsArgs::default().config().unwrap(),
            StructuredOutputsConfig::default()
        );
        assert_eq!(
            args(r#"{"backend": "auto"}"#).config().unwrap(),
            StructuredOutputsConfig::default()
        );
    }

    #[test]
    fn other_backends_unknown_keys_and_bad_values_are_refused() {
        for (json, expected) in [
            (r#"{"backend": "xgrammar"}"#, "llguidance"),
            (r#"{"backend": "magic"}"#, "unknown backend"),
            (r#"{"whitespace": true}"#, "unknown key"),
            (r#"{"disable_any_whitespace": "yes"}"#, "true or false"),
            (
                r#"{"reasoning_parser": "nope"}"#,
                "invalid reasoning parser",
            ),
            (r#"{"reasoning_parser_plugin": "x.py"}"#, "Python"),
            (r#"["backend"]"#, "JSON object"),
            ("{", "not JSON"),
        ] {
            let error = format!("{:#}", args(json).config().unwrap_err());
            assert!(error.contains(expected), "{json}: {error}");
        }
    }

    #[test]
    fn reasoning_parser_is_one_setting_under_two_names() {
        let config = args(r#"{"reasoning_parser": "qwen3"}"#);
        assert_eq!(
            config.reasoning_parser(None).unwrap().as_deref(),
            Some("qwen3")
        );
        assert_eq!(
            config
                .reasoning_parser(Some("qwen3".into()))
                .unwrap()
                .as_deref(),
            Some("qwen3")
        );
        assert!(config.reasoning_parser(Some("granite".into())).is_err());
        assert_eq!(
            StructuredOutputsArgs::default()
                .reasoning_parser(Some("granite".into()))
                .unwrap()
                .as_deref(),
            Some("granite")
        );
        let waits = args(r#"{"reasoning_parser": "qwen3", "enable_in_reasoning": false}"#);
        assert!(waits.reasoning_parser(None).is_err());
        let applies = args(r#"{"reasoning_parser": "qwen3", "enable_in_reasoning": true}"#);
        assert!(applies.reasoning_parser(None).is_ok());
        // Without a reasoning parser there is no reasoning to wait for.
        assert!(args(r#"{"enable_in_reasoning": false}"#)
            .reasoning_parser(None)
            .unwrap()
            .is_none());
    }
}
