//! The Responses API's `tools` and `tool_choice`, checked and turned into chat completions'
//! function tools, and the map that reads the model's calls back as Responses items.
//!
//! - `function` tools pass through in chat's shape.
//! - `custom` tools (free-form: the input is raw text) are offered to the model as a function
//!   with one string argument, `input` ([`CUSTOM_INPUT_ARGUMENT`]); a call to one comes back
//!   as a `custom_tool_call` whose `input` is that string. A `format` of `text` leaves the
//!   string free; `grammar` with `syntax: "regex"` becomes the string's JSON-schema
//!   `pattern`, which holds wherever tool output is constrained (a forced call, or the
//!   `generic` parser; the route refuses it elsewhere); `syntax: "lark"` is a 400 (a Lark
//!   grammar cannot be placed inside the JSON envelope the constraint engine writes).
//! - `namespace` tools group function and custom tools: each is offered as
//!   `namespace.name` (a dot, which a function name cannot hold, so nothing collides) and
//!   its calls come back with `namespace` and the bare `name`.
//! - Hosted tools (`web_search`, ...) need a service: declared ones are set aside (not
//!   offered); forcing one is a 400. Any other type is a 400 naming it.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ProtocolError;
use crate::responses::{ResponsesRequest, HOSTED_TOOL_TYPES};

/// The one argument a custom tool's function takes: its raw input.
pub const CUSTOM_INPUT_ARGUMENT: &str = "input";

/// What a name the model calls stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolTarget {
    /// A custom tool (answered as `custom_tool_call`), else a function.
    pub custom: bool,
    /// The tool's own name.
    pub name: String,
    pub namespace: Option<String>,
}

/// The model-facing tool names of a request and what each stands for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolNames {
    targets: HashMap<String, ToolTarget>,
}

impl ToolNames {
    /// What a call to `called` is: a declared tool's target, else a plain function of that
    /// name (a free-text parser may read a name nobody declared).
    pub fn target(&self, called: &str) -> ToolTarget {
        self.targets.get(called).cloned().unwrap_or(ToolTarget {
            custom: false,
            name: called.to_string(),
            namespace: None,
        })
    }

    fn insert(&mut self, model_name: String, target: ToolTarget) {
        self.targets.insert(model_name, target);
    }
}

/// The name the model sees for `name` in `namespace`.
pub fn model_tool_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}.{name}"),
        None => name.to_string(),
    }
}

/// A custom call's input as its function's arguments (JSON text).
pub fn custom_arguments(input: &str) -> String {
    json!({ CUSTOM_INPUT_ARGUMENT: input }).to_string()
}

/// A custom call's input from the arguments the model wrote: the `input` string, or (when
/// a free-text parser read something else) the arguments text itself.
pub fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(object)) if object.len() == 1 => match object.get(CUSTOM_INPUT_ARGUMENT) {
            Some(Value::String(input)) => input.clone(),
            _ => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

/// The checked tool fields, in chat completions' shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponsesTools {
    /// Function tools as chat completions takes them (`None`: no tool to offer).
    pub tools: Option<Vec<Value>>,
    /// `tool_choice` in chat completions' shape.
    pub tool_choice: Option<Value>,
    /// Declared hosted tools, not offered to the model.
    pub skipped: Vec<String>,
    /// How the model's call names map back to items.
    pub names: ToolNames,
    /// The `format` params of custom tools whose input is constrained (a regex): they need
    /// the constrained tool output.
    pub constrained_formats: Vec<String>,
}

/// A function tool as the Responses API declares it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionTool {
    #[serde(rename = "type")]
    _type: String,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

/// A custom tool's `format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum CustomFormat {
    Text {},
    Grammar { syntax: String, definition: String },
}

/// A custom (free-form) tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomTool {
    #[serde(rename = "type")]
    _type: String,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    format: Option<CustomFormat>,
}

/// A group of tools under one name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceTool {
    #[serde(rename = "type")]
    _type: String,
    name: String,
    #[serde(default)]
    description: Option<String>,
    tools: Vec<Value>,
}

fn parse_as<T: for<'de> Deserialize<'de>>(tool: &Value, param: &str) -> Result<T, ProtocolError> {
    serde_json::from_value(tool.clone())
        .map_err(|e| ProtocolError::invalid(param.to_string(), format!("{param}: {e}")))
}

/// Collects the offered tools, the name map and the constrained formats.
struct Collector {
    functions: Vec<Value>,
    names: ToolNames,
    constrained_formats: Vec<String>,
}

impl Collector {
    fn function(
        &mut self,
        tool: &Value,
        param: &str,
        namespace: Option<&NamespaceTool>,
    ) -> Result<(), ProtocolError> {
        let function: FunctionTool = parse_as(tool, param)?;
        let model_name = model_tool_name(namespace.map(|n| n.name.as_str()), &function.name);
        let mut definition = json!({"name": model_name});
        let description = join_descriptions(namespace, function.description.as_deref());
        if let Some(description) = description {
            definition["description"] = Value::String(description);
        }
        if let Some(parameters) = function.parameters {
            definition["parameters"] = parameters;
        }
        if let Some(strict) = function.strict {
            definition["strict"] = Value::Bool(strict);
        }
        self.offer(model_name, definition, false, function.name, namespace);
        Ok(())
    }

    fn custom(
        &mut self,
        tool: &Value,
        param: &str,
        namespace: Option<&NamespaceTool>,
    ) -> Result<(), ProtocolError> {
        let custom: CustomTool = parse_as(tool, param)?;
        let mut input =
            json!({"type": "string", "description": "The tool's raw input (free text, not JSON)."});
        match &custom.format {
            None | Some(CustomFormat::Text {}) => {}
            Some(CustomFormat::Grammar { syntax, definition }) => match syntax.as_str() {
                "regex" => {
                    check_regex_definition(definition, param)?;
                    input["pattern"] = Value::String(format!("^(?:{definition})$"));
                    input["description"] = Value::String(format!(
                        "The tool's raw input, matching the regular expression {definition}."
                    ));
                    self.constrained_formats.push(format!("{param}.format"));
                }
                "lark" => {
                    return Err(ProtocolError::unsupported(
                        format!("{param}.format.syntax"),
                        format!(
                            "{param}.format.syntax: \"lark\" grammars are not supported for \
                             custom tools (a tool's input is written inside the JSON envelope \
                             the constraint engine enforces, where a Lark grammar cannot be \
                             placed); use \"regex\", or format {{\"type\": \"text\"}}."
                        ),
                    ))
                }
                other => {
                    return Err(ProtocolError::invalid(
                        format!("{param}.format.syntax"),
                        format!(
                            "{param}.format.syntax must be \"lark\" or \"regex\", got {other:?}."
                        ),
                    ))
                }
            },
        }
        let model_name = model_tool_name(namespace.map(|n| n.name.as_str()), &custom.name);
        let mut definition = json!({
            "name": model_name,
            "parameters": {
                "type": "object",
                "properties": { CUSTOM_INPUT_ARGUMENT: input },
                "required": [CUSTOM_INPUT_ARGUMENT],
                "additionalProperties": false,
            },
        });
        if let Some(description) = join_descriptions(namespace, custom.description.as_deref()) {
            definition["description"] = Value::String(description);
        }
        self.offer(model_name, definition, true, custom.name, namespace);
        Ok(())
    }

    /// Offers `definition` to the model as a chat function and records whom its calls reach.
    fn offer(
        &mut self,
        model_name: String,
        definition: Value,
        custom: bool,
        name: String,
        namespace: Option<&NamespaceTool>,
    ) {
        self.functions
            .push(json!({"type": "function", "function": definition}));
        let namespace = namespace.map(|n| n.name.clone());
        self.names.insert(
            model_name,
            ToolTarget {
                custom,
                name,
                namespace,
            },
        );
    }
}

fn join_descriptions(namespace: Option<&NamespaceTool>, own: Option<&str>) -> Option<String> {
    match (namespace.and_then(|n| n.description.as_deref()), own) {
        (Some(group), Some(own)) => Some(format!("{group} {own}")),
        (Some(group), None) => Some(group.to_string()),
        (None, own) => own.map(str::to_string),
    }
}

/// An empty regex is refused here; the constraint engine compiles the rest (a bad pattern
/// fails there, as the grammar of `tools`).
fn check_regex_definition(definition: &str, param: &str) -> Result<(), ProtocolError> {
    if definition.is_empty() {
        return Err(ProtocolError::invalid(
            format!("{param}.format.definition"),
            format!("{param}.format.definition is empty."),
        ));
    }
    Ok(())
}

impl ResponsesRequest {
    /// The tool fields checked (see the module docs).
    pub fn tools(&self) -> Result<ResponsesTools, ProtocolError> {
        let mut out = ResponsesTools::default();
        let mut collector = Collector {
            functions: Vec::new(),
            names: ToolNames::default(),
            constrained_formats: Vec::new(),
        };
        for (index, tool) in self.tools.iter().flatten().enumerate() {
            let param = format!("tools[{index}]");
            match tool_kind(tool) {
                "function" => collector.function(tool, &param, None)?,
                "custom" => collector.custom(tool, &param, None)?,
                "namespace" => {
                    let namespace: NamespaceTool = parse_as(tool, &param)?;
                    for (inner_index, inner) in namespace.tools.iter().enumerate() {
                        let inner_param = format!("{param}.tools[{inner_index}]");
                        match tool_kind(inner) {
                            "function" => {
                                collector.function(inner, &inner_param, Some(&namespace))?
                            }
                            "custom" => collector.custom(inner, &inner_param, Some(&namespace))?,
                            other => {
                                return Err(ProtocolError::unsupported(
                                    format!("{inner_param}.type"),
                                    format!(
                                        "{inner_param}.type: a namespace holds function and \
                                         custom tools, got {other:?}."
                                    ),
                                ))
                            }
                        }
                    }
                }
                hosted if HOSTED_TOOL_TYPES.contains(&hosted) => {
                    out.skipped.push(hosted.to_string())
                }
                other => {
                    return Err(ProtocolError::unsupported(
                        format!("{param}.type"),
                        format!(
                            "{param}.type: tool type {other:?} is not supported; function, \
                             custom and namespace tools are (hosted tools such as web_search \
                             are declared but not offered)."
                        ),
                    ))
                }
            }
        }
        let Collector {
            functions,
            names,
            constrained_formats,
        } = collector;
        out.tool_choice = self.chat_tool_choice()?;
        if functions.is_empty()
            && !out.skipped.is_empty()
            && matches!(&out.tool_choice, Some(Value::String(mode)) if mode == "required")
        {
            return Err(ProtocolError::unsupported(
                "tool_choice",
                "tool_choice \"required\" with only hosted tools declared: none of them can run \
                 on this server.",
            ));
        }
        out.tools = (!functions.is_empty()).then_some(functions);
        out.names = names;
        out.constrained_formats = constrained_formats;
        Ok(out)
    }

    /// `tool_choice` in chat completions' shape: a named function or custom tool (with its
    /// `namespace`, if any) becomes a forced function call.
    fn chat_tool_choice(&self) -> Result<Option<Value>, ProtocolError> {
        Ok(match &self.tool_choice {
            None => None,
            Some(Value::String(mode)) if matches!(mode.as_str(), "auto" | "none" | "required") => {
                Some(Value::String(mode.clone()))
            }
            Some(Value::Object(choice)) => {
                let kind = choice.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "function" | "custom" => {
                        let name = choice.get("name").and_then(Value::as_str).ok_or_else(|| {
                            ProtocolError::invalid(
                                "tool_choice",
                                format!("tool_choice {{\"type\": \"{kind}\"}} needs a `name`."),
                            )
                        })?;
                        let namespace = choice.get("namespace").and_then(Value::as_str);
                        let model_name = model_tool_name(namespace, name);
                        Some(json!({"type": "function", "function": {"name": model_name}}))
                    }
                    hosted if HOSTED_TOOL_TYPES.contains(&hosted) => {
                        return Err(ProtocolError::unsupported(
                            "tool_choice",
                            format!(
                                "tool_choice forces the hosted tool {hosted:?}, which cannot run \
                                 on this server."
                            ),
                        ))
                    }
                    other => {
                        return Err(ProtocolError::unsupported(
                            "tool_choice",
                            format!("tool_choice of type {other:?} is not supported."),
                        ))
                    }
                }
            }
            Some(other) => {
                return Err(ProtocolError::invalid(
                    "tool_choice",
                    format!("tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\" | \"custom\", \"name\"}}; got {other}."),
                ))
            }
        })
    }
}

fn tool_kind(tool: &Value) -> &str {
    tool.get("type").and_then(Value::as_str).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        crate::anthropic::parse_anthropic(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn tools_split_into_functions_and_hosted_ones() {
        let parsed = request(json!({
            "input": "x",
            "tools": [
                {"type": "web_search", "external_web_access": true},
                {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true},
            ],
            "tool_choice": {"type": "function", "name": "f"},
        }));
        let tools = parsed.tools().unwrap();
        assert_eq!(tools.skipped, ["web_search"]);
        assert_eq!(tools.tools.unwrap()[0]["function"]["name"], "f");
        assert_eq!(tools.tool_choice.unwrap()["function"]["name"], "f");
        let forced = request(
            json!({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}),
        );
        assert_eq!(forced.tools().unwrap_err().param(), Some("tool_choice"));
        let unknown = request(json!({"input": "x", "tools": [{"type": "tool_search"}]}));
        assert_eq!(unknown.tools().unwrap_err().param(), Some("tools[0].type"));
    }

    #[test]
    fn custom_tools_are_functions_of_one_string() {
        let parsed = request(json!({
            "input": "x",
            "tools": [
                {"type": "custom", "name": "shell", "description": "Runs a command."},
                {"type": "custom", "name": "digits", "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}},
                {"type": "custom", "name": "note", "format": {"type": "text"}},
            ],
            "tool_choice": {"type": "custom", "name": "digits"},
        }));
        let tools = parsed.tools().unwrap();
        let offered = tools.tools.unwrap();
        assert_eq!(offered[0]["function"]["name"], "shell");
        assert_eq!(offered[0]["function"]["description"], "Runs a command.");
        assert_eq!(
            offered[0]["function"]["parameters"]["required"],
            json!(["input"])
        );
        assert_eq!(
            offered[1]["function"]["parameters"]["properties"]["input"]["pattern"],
            "^(?:[0-9]+)$"
        );
        assert_eq!(tools.constrained_formats, ["tools[1].format"]);
        assert_eq!(tools.tool_choice.unwrap()["function"]["name"], "digits");
        assert!(tools.names.target("shell").custom);
        assert!(!tools.names.target("undeclared").custom);
        for (body, param) in [
            (
                json!({"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"a\""}}),
                "tools[0].format.syntax",
            ),
            (
                json!({"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}),
                "tools[0].format.syntax",
            ),
            (
                json!({"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "regex", "definition": ""}}),
                "tools[0].format.definition",
            ),
            (
                json!({"type": "custom", "name": "p", "extra": 1}),
                "tools[0]",
            ),
        ] {
            let error = request(json!({"input": "x", "tools": [body]}))
                .tools()
                .unwrap_err();
            assert_eq!(error.param(), Some(param), "{error}");
        }
    }

    #[test]
    fn namespaced_tools_are_offered_under_a_dotted_name() {
        let parsed = request(json!({
            "input": "x",
            "tools": [{"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                {"type": "function", "name": "spawn", "parameters": {"type": "object"}},
                {"type": "custom", "name": "script"},
            ]}],
        }));
        let tools = parsed.tools().unwrap();
        let offered = tools.tools.unwrap();
        assert_eq!(offered[0]["function"]["name"], "agents.spawn");
        assert_eq!(offered[0]["function"]["description"], "Sub-agents.");
        let spawn = tools.names.target("agents.spawn");
        assert_eq!(
            (
                spawn.custom,
                spawn.name.as_str(),
                spawn.namespace.as_deref()
            ),
            (false, "spawn", Some("agents"))
        );
        assert!(tools.names.target("agents.script").custom);
        let nested = request(
            json!({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]}),
        );
        assert_eq!(
            nested.tools().unwrap_err().param(),
            Some("tools[0].tools[0].type")
        );
    }

    #[test]
    fn custom_input_round_trips_through_arguments() {
        let input = "*** Begin Patch\n\"quoted\"\n";
        assert_eq!(custom_input(&custom_arguments(input)), input);
        assert_eq!(custom_input("not json"), "not json");
        assert_eq!(custom_input("{\"other\": 1}"), "{\"other\": 1}");
    }
}
