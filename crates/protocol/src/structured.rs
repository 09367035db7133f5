//! Structured outputs on the wire: chat's `response_format`, vLLM's `structured_outputs`
//! object and the legacy `guided_*` fields, checked into one [`StructuredOutputRequest`].
//!
//! Only the shape is checked here (one constraint per request, JSON where JSON is due, a known
//! backend); whether a schema, regex or grammar compiles is the server's check, with the
//! engine's grammar compiler, and its 400 names the field recorded here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::ResponseFormat;
use crate::error::ProtocolError;

/// vLLM's `structured_outputs` request object (vLLM >= 0.11).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutputsParams {
    /// A JSON schema (an object, or its JSON text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Vec<String>>,
    /// Lark (llguidance's dialect) or GBNF (`root ::= ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_object: Option<bool>,
    /// Whitespace allowed between JSON tokens (a regex), for `json` / `json_object`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whitespace_pattern: Option<String>,
    /// Not supported: a 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structural_tag: Option<Value>,
}

/// The structured-output fields both endpoints accept, flattened into their requests: vLLM's
/// `structured_outputs` and the legacy `guided_*` names many clients still send.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuidedDecodingParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<StructuredOutputsParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_whitespace_pattern: Option<String>,
    /// `guidance` (llguidance) or `auto`; any other backend is a 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_decoding_backend: Option<String>,
}

/// What the output must match, checked for shape (vLLM's structured-outputs kinds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StructuredConstraint {
    /// A JSON schema, as compact JSON text.
    JsonSchema(String),
    /// Any JSON object.
    JsonObject,
    Regex(String),
    Choice(Vec<String>),
    /// Lark or GBNF text.
    Grammar(String),
}

/// A request's checked constraint and the field it came from (named in compile errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StructuredOutputRequest {
    pub constraint: StructuredConstraint,
    pub param: &'static str,
}

/// Backends a request may name: tokenmill's structured outputs are llguidance.
const BACKENDS: [&str; 3] = ["auto", "guidance", "llguidance"];

/// A JSON schema given as an object (or `true`), or as JSON text, to compact JSON text.
pub(crate) fn schema_text(param: &'static str, schema: &Value) -> Result<String, ProtocolError> {
    let schema = match schema {
        Value::String(text) => serde_json::from_str(text).map_err(|e| {
            ProtocolError::invalid(param, format!("{param} is not valid JSON: {e}."))
        })?,
        other => other.clone(),
    };
    match schema {
        Value::Object(_) | Value::Bool(true) => Ok(schema.to_string()),
        _ => Err(ProtocolError::invalid(
            param,
            format!("{param} must be a JSON schema object."),
        )),
    }
}

impl GuidedDecodingParams {
    /// The one constraint the request asks for (from these fields or `response_format`), or
    /// none; two kinds at once, an unknown backend or a malformed field is a 400.
    pub fn validate(
        &self,
        response_format: Option<&ResponseFormat>,
    ) -> Result<Option<StructuredOutputRequest>, ProtocolError> {
        if let Some(backend) = self.guided_decoding_backend.as_deref() {
            if !BACKENDS.contains(&backend) {
                return Err(ProtocolError::unsupported(
                    "guided_decoding_backend",
                    format!(
                        "guided_decoding_backend {backend:?} is not available: tokenmill's \
                         structured outputs use llguidance ('guidance'; 'auto' selects it)."
                    ),
                ));
            }
        }
        let mut found: Vec<StructuredOutputRequest> = Vec::new();
        let mut add = |param: &'static str, constraint: StructuredConstraint| {
            found.push(StructuredOutputRequest { constraint, param });
        };
        if let Some(format) = response_format {
            match format.format_type.as_str() {
                "json_object" => add("response_format", StructuredConstraint::JsonObject),
                "json_schema" => {
                    let param = "response_format.json_schema.schema";
                    let schema = format
                        .json_schema
                        .as_ref()
                        .and_then(|body| body.get("schema"))
                        .ok_or_else(|| {
                            ProtocolError::invalid(
                                "response_format",
                                "response_format.json_schema must have a 'schema'.",
                            )
                        })?;
                    add(
                        param,
                        StructuredConstraint::JsonSchema(schema_text(param, schema)?),
                    );
                }
                _ => {}
            }
        }
        if let Some(outputs) = &self.structured_outputs {
            if outputs.structural_tag.is_some() {
                return Err(ProtocolError::unsupported(
                    "structured_outputs.structural_tag",
                    "structural_tag is not supported by tokenmill yet.",
                ));
            }
            if let Some(schema) = &outputs.json {
                let param = "structured_outputs.json";
                add(
                    param,
                    StructuredConstraint::JsonSchema(schema_text(param, schema)?),
                );
            }
            if let Some(regex) = &outputs.regex {
                add(
                    "structured_outputs.regex",
                    StructuredConstraint::Regex(regex.clone()),
                );
            }
            if let Some(choice) = &outputs.choice {
                add(
                    "structured_outputs.choice",
                    StructuredConstraint::Choice(choice.clone()),
                );
            }
            if let Some(grammar) = &outputs.grammar {
                add(
                    "structured_outputs.grammar",
                    StructuredConstraint::Grammar(grammar.clone()),
                );
            }
            if outputs.json_object == Some(true) {
                add(
                    "structured_outputs.json_object",
                    StructuredConstraint::JsonObject,
                );
            }
        }
        if let Some(schema) = &self.guided_json {
            add(
                "guided_json",
                StructuredConstraint::JsonSchema(schema_text("guided_json", schema)?),
            );
        }
        if let Some(regex) = &self.guided_regex {
            add("guided_regex", StructuredConstraint::Regex(regex.clone()));
        }
        if let Some(choice) = &self.guided_choice {
            add(
                "guided_choice",
                StructuredConstraint::Choice(choice.clone()),
            );
        }
        if let Some(grammar) = &self.guided_grammar {
            add(
                "guided_grammar",
                StructuredConstraint::Grammar(grammar.clone()),
            );
        }
        let whitespace = match (
            &self.guided_whitespace_pattern,
            self.structured_outputs
                .as_ref()
                .and_then(|outputs| outputs.whitespace_pattern.as_ref()),
        ) {
            (Some(pattern), _) => Some(("guided_whitespace_pattern", pattern)),
            (None, Some(pattern)) => Some(("structured_outputs.whitespace_pattern", pattern)),
            (None, None) => None,
        };
        if found.len() > 1 {
            let params: Vec<&str> = found.iter().map(|request| request.param).collect();
            return Err(ProtocolError::invalid(
                found[1].param,
                format!(
                    "Only one kind of structured output may be requested, got {}.",
                    params.join(" and ")
                ),
            ));
        }
        let Some(mut request) = found.pop() else {
            return match whitespace {
                Some((param, _)) => Err(ProtocolError::invalid(
                    param,
                    format!("{param} applies only to a JSON schema or JSON object output."),
                )),
                None => Ok(None),
            };
        };
        if let Some((param, pattern)) = whitespace {
            let schema = match &request.constraint {
                StructuredConstraint::JsonSchema(text) => {
                    serde_json::from_str(text).unwrap_or(Value::Bool(true))
                }
                StructuredConstraint::JsonObject => serde_json::json!({"type": "object"}),
                _ => {
                    return Err(ProtocolError::invalid(
                        param,
                        format!("{param} applies only to a JSON schema or JSON object output."),
                    ))
                }
            };
            // llguidance reads JSON-compilation options from the schema's `x-guidance` key.
            let schema = match schema {
                Value::Object(mut object) => {
                    object.insert(
                        "x-guidance".into(),
                        serde_json::json!({"whitespace_pattern": pattern}),
                    );
                    Value::Object(object)
                }
                _ => serde_json::json!({"x-guidance": {"whitespace_pattern": pattern}}),
            };
            request.constraint = StructuredConstraint::JsonSchema(schema.to_string());
        }
        Ok(Some(request))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(body: Value) -> GuidedDecodingParams {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn each_spelling_maps_to_one_constraint() {
        let cases = [
            (json!({"guided_json": {"type": "object"}}), "guided_json"),
            (
                json!({"guided_json": "{\"type\": \"object\"}"}),
                "guided_json",
            ),
            (json!({"guided_regex": "a+"}), "guided_regex"),
            (json!({"guided_choice": ["a", "b"]}), "guided_choice"),
            (json!({"guided_grammar": "start: \"a\""}), "guided_grammar"),
            (
                json!({"structured_outputs": {"json": {"type": "object"}}}),
                "structured_outputs.json",
            ),
            (
                json!({"structured_outputs": {"regex": "a"}}),
                "structured_outputs.regex",
            ),
            (
                json!({"structured_outputs": {"choice": ["a"]}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"grammar": "root ::= \"a\""}}),
                "structured_outputs.grammar",
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                "structured_outputs.json_object",
            ),
        ];
        for (body, param) in cases {
            let request = parse(body).validate(None).unwrap().unwrap();
            assert_eq!(request.param, param);
        }
        let format = ResponseFormat {
            format_type: "json_schema".into(),
            json_schema: Some(json!({"name": "x", "schema": {"type": "integer"}})),
        };
        let request = parse(json!({})).validate(Some(&format)).unwrap().unwrap();
        assert_eq!(
            request.constraint,
            StructuredConstraint::JsonSchema("{\"type\":\"integer\"}".into())
        );
        let text = ResponseFormat {
            format_type: "text".into(),
            json_schema: None,
        };
        assert_eq!(parse(json!({})).validate(Some(&text)).unwrap(), None);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let cases = [
            (json!({"guided_json": "{not json"}), "guided_json"),
            (json!({"guided_json": 3}), "guided_json"),
            (
                json!({"guided_regex": "a", "guided_choice": ["a"]}),
                "guided_choice",
            ),
            (
                json!({"guided_decoding_backend": "xgrammar"}),
                "guided_decoding_backend",
            ),
            (
                json!({"guided_whitespace_pattern": " "}),
                "guided_whitespace_pattern",
            ),
            (
                json!({"guided_regex": "a", "guided_whitespace_pattern": " "}),
                "guided_whitespace_pattern",
            ),
            (
                json!({"structured_outputs": {"structural_tag": {}}}),
                "structured_outputs.structural_tag",
            ),
        ];
        for (body, param) in cases {
            let error = parse(body.clone()).validate(None).unwrap_err();
            assert_eq!(error.param(), Some(param), "{body}");
        }
        let error = parse(json!({"guided_decoding_backend": "outlines"}))
            .validate(None)
            .unwrap_err();
        assert!(error.to_string().contains("llguidance"), "{error}");
    }

    #[test]
    fn whitespace_pattern_goes_into_the_schema() {
        let request =
            parse(json!({"guided_json": {"type": "object"}, "guided_whitespace_pattern": " ?"}))
                .validate(None)
                .unwrap()
                .unwrap();
        assert_eq!(
            request.constraint,
            StructuredConstraint::JsonSchema(
                "{\"type\":\"object\",\"x-guidance\":{\"whitespace_pattern\":\" ?\"}}".into()
            )
        );
    }
}
