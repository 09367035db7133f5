//! Tool calling on the wire: `tools`, `tool_choice`, `parallel_tool_calls`, the calls in a
//! response, and the plan a request's tool fields make (which prompt, which constraint,
//! which parser).
//!
//! Forced calls (`required`, a named function) and the generic mode (a template without
//! tool support) constrain the output to one JSON envelope, `{"tool_calls": [{"name",
//! "arguments"}, ...]}` (or `{"response": "..."}` where text is allowed), built here as a
//! JSON schema for the grammar engine and parsed by the text crate's `generic` parser.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::chat::{ConversationMessage, Role};
use crate::error::ProtocolError;

/// vLLM's message when `tool_choice: "auto"` reaches a server without a tool parser.
pub const AUTO_TOOL_CHOICE_DISABLED: &str =
    "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set";

/// A function tool's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of the arguments object (any object when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Accepted: forced and generic-mode calls always follow the schema, whatever `strict`
    /// says; a free-text parser (`auto` with hermes, ...) reads what the model wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// One entry of `tools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTool {
    #[serde(rename = "type")]
    pub tool_type: String,
    pub function: FunctionDefinition,
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    /// `{"type": "function", "function": {"name": ...}}`.
    Function(String),
}

/// A call in a response message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub call_type: String,
    pub function: FunctionCall,
}

/// The function half of a [`ToolCall`]; `arguments` is JSON text, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// A function call with a fresh `call_...` id.
    pub fn function(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: tool_call_id(),
            call_type: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

/// A fresh tool-call id (`call_` and 24 alphanumerics, OpenAI's shape).
pub fn tool_call_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// A streamed piece of a call: the first carries `id`, `type` and `function.name`, later
/// ones only `function.arguments`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeltaToolCall {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub call_type: Option<String>,
    pub function: DeltaFunctionCall,
}

/// The function half of a [`DeltaToolCall`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeltaFunctionCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// The server's tool settings (its flags, vLLM's names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSettings {
    /// `--enable-auto-tool-choice`.
    pub enable_auto_tool_choice: bool,
    /// `--tool-call-parser`.
    pub tool_call_parser: Option<String>,
    /// `--exclude-tools-when-tool-choice-none`.
    pub exclude_tools_when_tool_choice_none: bool,
}

/// How a request's output is produced and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    /// No tool calls: plain text.
    Text,
    /// Free generation read by the named `--tool-call-parser`.
    Parser(String),
    /// Output constrained to the JSON envelope (this schema, as JSON text) and read by the
    /// `generic` parser; `forced` when a call is required (the turn ends in `tool_calls`).
    Envelope { schema: String, forced: bool },
}

/// A request's checked tool fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub choice: ToolChoice,
    pub tools: Vec<ChatTool>,
    pub parallel_tool_calls: bool,
    pub output: ToolOutput,
    /// Tools as the chat template receives them (`None`: not passed).
    pub template_tools: Option<Vec<Value>>,
    /// A system prompt describing the tools, for templates that cannot render them.
    pub system_prompt: Option<String>,
}

/// Parses `tools` (each a function tool with a name) into typed definitions.
pub fn parse_tools(tools: &[Value]) -> Result<Vec<ChatTool>, ProtocolError> {
    tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            let parsed: ChatTool = serde_json::from_value(tool.clone()).map_err(|e| {
                ProtocolError::invalid(
                    "tools",
                    format!("tools[{index}] is not a function tool: {e}."),
                )
            })?;
            if parsed.tool_type != "function" {
                return Err(ProtocolError::unsupported(
                    "tools",
                    format!(
                        "tools[{index}]: only \"function\" tools are supported, got {:?}.",
                        parsed.tool_type
                    ),
                ));
            }
            if let Some(parameters) = &parsed.function.parameters {
                if !parameters.is_object() {
                    return Err(ProtocolError::invalid(
                        "tools",
                        format!("tools[{index}].function.parameters must be a JSON schema object."),
                    ));
                }
            }
            Ok(parsed)
        })
        .collect()
}

/// Parses `tool_choice` (`None` on the wire: the default, decided by the caller).
pub fn parse_tool_choice(choice: &Value) -> Result<Option<ToolChoice>, ProtocolError> {
    let bad = || {
        ProtocolError::invalid(
            "tool_choice",
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
        )
    };
    Ok(Some(match choice {
        Value::Null => return Ok(None),
        Value::String(text) => match text.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(bad()),
        },
        Value::Object(object) => {
            let name = object
                .get("function")
                .and_then(|function| function.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            ToolChoice::Function(name.to_string())
        }
        _ => return Err(bad()),
    }))
}

/// How the tool-call envelope's whitespace is written: fixed, so a small model cannot wander
/// off into endless blank lines and the parser sees one spelling.
fn envelope_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

fn call_schema(tool: &ChatTool) -> Value {
    let arguments = tool
        .function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    json!({
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

/// The envelope schema: calls to `tools` (at most one unless `parallel`), or, with
/// `allow_text`, a plain `response` instead.
pub fn envelope_schema(tools: &[&ChatTool], parallel: bool, allow_text: bool) -> Value {
    let calls: Vec<Value> = tools.iter().map(|tool| call_schema(tool)).collect();
    let mut array = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
    if !parallel {
        array["maxItems"] = json!(1);
    }
    let call_envelope = json!({
        "type": "object",
        "properties": {"tool_calls": array},
        "required": ["tool_calls"],
        "additionalProperties": false
    });
    let mut schema = if allow_text {
        json!({"anyOf": [call_envelope, {
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": false
        }]})
    } else {
        call_envelope
    };
    schema["x-guidance"] = envelope_options();
    schema
}

/// The system prompt that describes `tools` to a model whose template cannot.
pub fn tool_system_prompt(tools: &[&ChatTool], allow_text: bool) -> String {
    let described: Vec<Value> = tools
        .iter()
        .map(|tool| serde_json::to_value(&tool.function).unwrap_or(Value::Null))
        .collect();
    let listing = serde_json::to_string_pretty(&described).unwrap_or_default();
    let answer = if allow_text {
        "Respond in JSON format, either with `tool_calls` (a request to call tools) or with \
         `response` (your reply to the user's request): {\"tool_calls\": [{\"name\": \"<tool \
         name>\", \"arguments\": {<arguments>}}]} or {\"response\": \"<your reply>\"}."
    } else {
        "Respond in JSON format with the tools to call: {\"tool_calls\": [{\"name\": \"<tool \
         name>\", \"arguments\": {<arguments>}}]}."
    };
    format!("You can call the following tools:\n{listing}\n\n{answer}")
}

/// Checks the tool fields and decides how the output is produced. `template_renders_tools`:
/// whether the chat template in use puts `tools` into the prompt.
pub fn plan_tools(
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    parallel_tool_calls: Option<bool>,
    settings: &ToolSettings,
    template_renders_tools: bool,
) -> Result<ToolPlan, ProtocolError> {
    let parsed = parse_tools(tools.unwrap_or_default())?;
    let explicit = match tool_choice {
        Some(choice) => parse_tool_choice(choice)?,
        None => None,
    };
    let choice = explicit.clone().unwrap_or(if parsed.is_empty() {
        ToolChoice::None
    } else {
        ToolChoice::Auto
    });
    let parallel = parallel_tool_calls.unwrap_or(true);
    let mut plan = ToolPlan {
        choice: choice.clone(),
        tools: parsed.clone(),
        parallel_tool_calls: parallel,
        output: ToolOutput::Text,
        template_tools: tools
            .filter(|tools| !tools.is_empty())
            .map(<[Value]>::to_vec),
        system_prompt: None,
    };
    if parsed.is_empty() {
        return match choice {
            ToolChoice::Required | ToolChoice::Function(_) => Err(ProtocolError::invalid(
                "tool_choice",
                "When using `tool_choice`, `tools` must be set.",
            )),
            // `auto` with no tools is plain generation.
            ToolChoice::None | ToolChoice::Auto => Ok(plan),
        };
    }
    let all: Vec<&ChatTool> = parsed.iter().collect();
    match &choice {
        ToolChoice::None => {
            if settings.exclude_tools_when_tool_choice_none {
                plan.template_tools = None;
            }
        }
        ToolChoice::Auto => {
            let parser = match (&settings.tool_call_parser, settings.enable_auto_tool_choice) {
                (Some(parser), true) => parser.clone(),
                _ => {
                    return Err(ProtocolError::invalid(
                        "tool_choice",
                        AUTO_TOOL_CHOICE_DISABLED,
                    ))
                }
            };
            if parser == "generic" {
                plan.output = ToolOutput::Envelope {
                    schema: envelope_schema(&all, parallel, true).to_string(),
                    forced: false,
                };
                plan.system_prompt = Some(tool_system_prompt(&all, true));
                plan.template_tools = None;
            } else {
                plan.output = ToolOutput::Parser(parser);
            }
        }
        ToolChoice::Required | ToolChoice::Function(_) => {
            let chosen: Vec<&ChatTool> = match &choice {
                ToolChoice::Function(name) => {
                    let tool = parsed
                        .iter()
                        .find(|tool| &tool.function.name == name)
                        .ok_or_else(|| {
                            ProtocolError::invalid(
                                "tool_choice",
                                format!("Tool '{name}' has not been passed in `tools`."),
                            )
                        })?;
                    vec![tool]
                }
                _ => all,
            };
            let single = matches!(choice, ToolChoice::Function(_)) || !parallel;
            plan.output = ToolOutput::Envelope {
                schema: envelope_schema(&chosen, !single, false).to_string(),
                forced: true,
            };
            if !template_renders_tools {
                plan.system_prompt = Some(tool_system_prompt(&chosen, false));
                plan.template_tools = None;
            }
        }
    }
    Ok(plan)
}

/// Prepares a conversation for the template: assistant `tool_calls` get their `arguments` as
/// objects (as vLLM passes them; HF templates `tojson` them). For a template without tool
/// support (`calls_as_content`), earlier calls are written as the envelope the generic mode
/// answers in, so the model sees them; a tool `system_prompt` is added to the system message.
pub fn prepare_tool_history(
    messages: &mut Vec<ConversationMessage>,
    system_prompt: Option<&str>,
    calls_as_content: bool,
) {
    for message in messages.iter_mut() {
        let Some(calls) = &mut message.tool_calls else {
            continue;
        };
        for call in calls.iter_mut() {
            if let Some(arguments) = call.pointer_mut("/function/arguments") {
                if let Some(parsed) = arguments
                    .as_str()
                    .and_then(|text| serde_json::from_str::<Value>(text).ok())
                {
                    *arguments = parsed;
                }
            }
        }
        if calls_as_content && message.content.as_deref().is_none_or(str::is_empty) {
            let envelope: Vec<Value> = calls
                .iter()
                .map(|call| {
                    json!({
                        "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
                        "arguments": call.pointer("/function/arguments").cloned().unwrap_or(json!({})),
                    })
                })
                .collect();
            message.content = Some(json!({"tool_calls": envelope}).to_string());
        }
    }
    let Some(prompt) = system_prompt else { return };
    match messages.first_mut() {
        Some(first) if matches!(first.role, Role::System | Role::Developer) => {
            let content = first.content.get_or_insert_with(String::new);
            if !content.is_empty() {
                content.push_str("\n\n");
            }
            content.push_str(prompt);
        }
        _ => messages.insert(
            0,
            ConversationMessage {
                reasoning_content: None,
                role: Role::System,
                content: Some(prompt.to_string()),
                name: None,
                tool_call_id: None,
                tool_calls: None,
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    fn settings(parser: Option<&str>) -> ToolSettings {
        ToolSettings {
            enable_auto_tool_choice: parser.is_some(),
            tool_call_parser: parser.map(str::to_string),
            exclude_tools_when_tool_choice_none: false,
        }
    }

    #[test]
    fn auto_needs_the_flags_with_vllms_message() {
        let tools = [weather()];
        let error = plan_tools(Some(&tools), None, None, &settings(None), true).unwrap_err();
        assert_eq!(error.param(), Some("tool_choice"));
        assert!(
            error.to_string().contains(AUTO_TOOL_CHOICE_DISABLED),
            "{error}"
        );
        let plan = plan_tools(
            Some(&tools),
            Some(&json!("auto")),
            None,
            &settings(Some("hermes")),
            true,
        )
        .unwrap();
        assert_eq!(plan.output, ToolOutput::Parser("hermes".into()));
        assert!(plan.template_tools.is_some() && plan.system_prompt.is_none());
        // No tools: plain text whatever the server's flags.
        let plain = plan_tools(None, Some(&json!("auto")), None, &settings(None), true).unwrap();
        assert_eq!(plain.output, ToolOutput::Text);
    }

    #[test]
    fn forced_choices_constrain_to_the_envelope() {
        let tools = [
            weather(),
            json!({"type": "function", "function": {"name": "noop"}}),
        ];
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let plan = plan_tools(Some(&tools), Some(&named), None, &settings(None), false).unwrap();
        let ToolOutput::Envelope {
            schema,
            forced: true,
        } = &plan.output
        else {
            panic!("{plan:?}")
        };
        let schema: Value = serde_json::from_str(schema).unwrap();
        let items = &schema["properties"]["tool_calls"];
        assert_eq!(items["maxItems"], 1);
        assert_eq!(items["items"]["anyOf"].as_array().unwrap().len(), 1);
        assert!(plan
            .system_prompt
            .as_deref()
            .unwrap()
            .contains("get_weather"));
        assert!(plan.template_tools.is_none());
        let required = plan_tools(
            Some(&tools),
            Some(&json!("required")),
            None,
            &settings(None),
            true,
        )
        .unwrap();
        let ToolOutput::Envelope { schema, .. } = &required.output else {
            panic!()
        };
        let schema: Value = serde_json::from_str(schema).unwrap();
        assert_eq!(
            schema["properties"]["tool_calls"]["items"]["anyOf"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert!(schema["properties"]["tool_calls"].get("maxItems").is_none());
        assert!(required.system_prompt.is_none() && required.template_tools.is_some());
    }

    #[test]
    fn bad_tool_fields_name_the_field() {
        let tools = [weather()];
        let unknown = json!({"type": "function", "function": {"name": "nope"}});
        let cases = [
            (
                plan_tools(Some(&tools), Some(&unknown), None, &settings(None), true),
                "tool_choice",
            ),
            (
                plan_tools(None, Some(&json!("required")), None, &settings(None), true),
                "tool_choice",
            ),
            (
                plan_tools(
                    Some(&tools),
                    Some(&json!("sometimes")),
                    None,
                    &settings(None),
                    true,
                ),
                "tool_choice",
            ),
            (
                plan_tools(
                    Some(&[json!({"type": "retrieval"})]),
                    None,
                    None,
                    &settings(None),
                    true,
                ),
                "tools",
            ),
            (
                plan_tools(
                    Some(&[
                        json!({"type": "function", "function": {"name": "f", "parameters": 3}}),
                    ]),
                    None,
                    None,
                    &settings(None),
                    true,
                ),
                "tools",
            ),
        ];
        for (result, param) in cases {
            assert_eq!(result.unwrap_err().param(), Some(param));
        }
    }

    #[test]
    fn history_arguments_become_objects_and_generic_history_the_envelope() {
        let mut messages = vec![ConversationMessage {
            reasoning_content: None,
            role: Role::Assistant,
            content: None,
            name: None,
            tool_call_id: None,
            tool_calls: Some(vec![json!({"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}})]),
        }];
        prepare_tool_history(&mut messages, Some("TOOLS"), true);
        assert_eq!(messages[0].role, Role::System);
        assert_eq!(messages[0].content.as_deref(), Some("TOOLS"));
        assert_eq!(
            messages[1].tool_calls.as_ref().unwrap()[0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        let content: Value = serde_json::from_str(messages[1].content.as_deref().unwrap()).unwrap();
        assert_eq!(
            content,
            json!({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]})
        );
    }
}
