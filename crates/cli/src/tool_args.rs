//! Tool-calling and reasoning flags (vLLM's names), shared by `serve` and `generate`.

use anyhow::bail;
use clap::Args;
use tokenmill_protocol::ToolSettings;
use tokenmill_text::tool_parsers::TOOL_PARSER_NAMES;
use tokenmill_text::REASONING_PARSER_NAMES;

#[derive(Debug, Clone, Args)]
pub struct ToolArgs {
    /// Let the model decide when to call tools (`tool_choice: "auto"`); needs --tool-call-parser.
    #[arg(long, help_heading = "Tools")]
    pub enable_auto_tool_choice: bool,
    /// How tool calls are read from the output: hermes, gemma4 (Gemma 4's call notation),
    /// llama3_json, mistral, openai (gpt-oss's harmony), pythonic, qwen3_xml, or generic
    /// (tools described in a system prompt, the answer constrained to JSON: for
    /// models whose chat template has no tool support, such as the default model).
    #[arg(long, value_name = "NAME", help_heading = "Tools")]
    pub tool_call_parser: Option<String>,
    /// vLLM loads Python parser plugins; tokenmill's parsers are built in (an error).
    #[arg(long, value_name = "PATH", help_heading = "Tools")]
    pub tool_parser_plugin: Option<String>,
    /// Do not pass `tools` to the chat template when `tool_choice` is "none".
    #[arg(long, help_heading = "Tools")]
    pub exclude_tools_when_tool_choice_none: bool,
    /// Split reasoning into `message.reasoning`: deepseek_r1, qwen3, granite, gemma4,
    /// openai_gptoss (gpt-oss's harmony `analysis` channel).
    #[arg(long, value_name = "NAME", help_heading = "Tools")]
    pub reasoning_parser: Option<String>,
}

impl ToolArgs {
    /// The checked settings and reasoning parser (vLLM's start-up errors).
    pub fn settings(&self) -> anyhow::Result<(ToolSettings, Option<String>)> {
        if let Some(plugin) = &self.tool_parser_plugin {
            bail!(
                "--tool-parser-plugin {plugin}: tool parser plugins are Python modules that vLLM \
                 imports; tokenmill cannot load them. Its parsers are built in: --tool-call-parser \
                 {{ {} }}",
                TOOL_PARSER_NAMES.join(",")
            );
        }
        if let Some(parser) = &self.tool_call_parser {
            if !TOOL_PARSER_NAMES.contains(&parser.as_str()) {
                bail!(
                    "invalid tool call parser: {parser} (chose from {{ {} }})",
                    TOOL_PARSER_NAMES.join(",")
                );
            }
        }
        if self.enable_auto_tool_choice && self.tool_call_parser.is_none() {
            bail!("--enable-auto-tool-choice requires --tool-call-parser");
        }
        if let Some(parser) = &self.reasoning_parser {
            if !REASONING_PARSER_NAMES.contains(&parser.as_str()) {
                bail!(
                    "invalid reasoning parser: {parser} (chose from {{ {} }})",
                    REASONING_PARSER_NAMES.join(",")
                );
            }
        }
        Ok((
            ToolSettings {
                enable_auto_tool_choice: self.enable_auto_tool_choice,
                tool_call_parser: self.tool_call_parser.clone(),
                exclude_tools_when_tool_choice_none: self.exclude_tools_when_tool_choice_none,
            },
            self.reasoning_parser.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::ToolArgs;

    fn args() -> ToolArgs {
        ToolArgs {
            enable_auto_tool_choice: false,
            tool_call_parser: None,
            tool_parser_plugin: None,
            exclude_tools_when_tool_choice_none: false,
            reasoning_parser: None,
        }
    }

    #[test]
    fn vllms_start_up_errors() {
        let auto_alone = ToolArgs {
            enable_auto_tool_choice: true,
            ..args()
        };
        assert!(auto_alone
            .settings()
            .unwrap_err()
            .to_string()
            .contains("requires --tool-call-parser"));
        let unknown = ToolArgs {
            tool_call_parser: Some("qwen25".into()),
            ..args()
        };
        assert!(unknown
            .settings()
            .unwrap_err()
            .to_string()
            .starts_with("invalid tool call parser: qwen25"));
        let plugin = ToolArgs {
            tool_parser_plugin: Some("my_parser.py".into()),
            ..args()
        };
        assert!(plugin
            .settings()
            .unwrap_err()
            .to_string()
            .contains("Python"));
        let reasoning = ToolArgs {
            reasoning_parser: Some("r2".into()),
            ..args()
        };
        assert!(reasoning.settings().is_err());
        let good = ToolArgs {
            enable_auto_tool_choice: true,
            tool_call_parser: Some("generic".into()),
            reasoning_parser: Some("qwen3".into()),
            ..args()
        };
        let (settings, reasoning) = good.settings().unwrap();
        assert!(settings.enable_auto_tool_choice);
        assert_eq!(reasoning.as_deref(), Some("qwen3"));
    }
}
