//! `json` and `json-unique` (the datasets of vLLM's structured-output benchmark): prompts that
//! ask for a JSON object, each request constrained by a JSON schema. `json` cycles through a
//! few schemas (after the first request of each, the server's compiled grammar is warm);
//! `json-unique` gives every request its own schema (an extra optional property with a
//! per-request name, as vLLM does), so every request pays a cold grammar compile. A fraction
//! `--structured-output-ratio` of the requests is constrained; the others send the same
//! prompt unconstrained, so one dataset measures both loads.

use std::path::Path;
use std::sync::Arc;

use rand::Rng;
use serde_json::{json, Value};

use super::request_rng;
use crate::client::RequestInput;
use crate::error::BenchError;
use crate::tokenize::PromptTokenizer;

/// What the `json` datasets need from the options.
#[derive(Debug, Clone)]
pub struct StructuredConfig<'a> {
    pub num_requests: usize,
    pub output_len: usize,
    /// Share of requests sent with their schema, in [0, 1].
    pub ratio: f64,
    /// A new schema for every request (`json-unique`).
    pub unique: bool,
    /// One schema file to use instead of the built-in ones.
    pub schema_path: Option<&'a Path>,
    pub seed: u64,
}

/// The built-in schemas: the features structured-output users lean on (nested objects,
/// bounded arrays, enums, `anyOf`, `$ref`/`$defs`, numeric bounds, string patterns), strings
/// bounded so that a complete object fits in a few hundred tokens.
pub fn builtin_schemas() -> Vec<Value> {
    vec![
        json!({
            "title": "user profile",
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 20},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                    },
                    "required": ["city", "zip"],
                    "additionalProperties": false
                },
                "interests": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 16},
                    "minItems": 1,
                    "maxItems": 3
                }
            },
            "required": ["name", "age", "email", "address", "interests"],
            "additionalProperties": false
        }),
        json!({
            "title": "order",
            "type": "object",
            "$defs": {
                "line": {
                    "type": "object",
                    "properties": {
                        "sku": {"enum": ["A-100", "B-200", "C-300"]},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
                        "unit_price": {"type": "number", "minimum": 0, "maximum": 1000}
                    },
                    "required": ["sku", "quantity", "unit_price"],
                    "additionalProperties": false
                }
            },
            "properties": {
                "order_id": {"type": "integer", "minimum": 1},
                "status": {"enum": ["pending", "shipped", "delivered"]},
                "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1, "maxItems": 3},
                "gift": {"type": "boolean"}
            },
            "required": ["order_id", "status", "lines", "gift"],
            "additionalProperties": false
        }),
        json!({
            "title": "event",
            "type": "object",
            "properties": {
                "kind": {"enum": ["click", "view", "purchase"]},
                "payload": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {"message": {"type": "string", "maxLength": 40}},
                            "required": ["message"],
                            "additionalProperties": false
                        },
                        {"type": "integer", "minimum": 0, "maximum": 100000}
                    ]
                },
                "retries": {"type": "integer", "minimum": 0, "maximum": 5}
            },
            "required": ["kind", "payload", "retries"],
            "additionalProperties": false
        }),
        json!({
            "title": "weather report",
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
                "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
                "forecast": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                            "high": {"type": "integer", "minimum": -50, "maximum": 60},
                            "low": {"type": "integer", "minimum": -50, "maximum": 60}
                        },
                        "required": ["day", "high", "low"],
                        "additionalProperties": false
                    },
                    "minItems": 2,
                    "maxItems": 3
                }
            },
            "required": ["city", "temperature_c", "conditions", "forecast"],
            "additionalProperties": false
        }),
    ]
}

fn read_schema(path: &Path) -> Result<Value, BenchError> {
    let dataset_error = |message: String| BenchError::Dataset {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|err| dataset_error(err.to_string()))?;
    let schema: Value = serde_json::from_str(&text)
        .map_err(|err| dataset_error(format!("not a JSON schema: {err}")))?;
    if !schema.is_object() {
        return Err(dataset_error("a JSON schema must be an object".into()));
    }
    Ok(schema)
}

/// `schema` with one more optional string property named after the run's seed and the
/// request, so that its text (the server's compile-cache key) is new, also across runs with
/// different seeds against one server.
fn uniquified(schema: &Value, seed: u64, index: usize) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        let properties = object.entry("properties").or_insert_with(|| json!({}));
        if let Some(properties) = properties.as_object_mut() {
            properties.insert(
                format!("note_{seed}_{index}"),
                json!({"type": "string", "maxLength": 8,
                       "description": "a per-request optional field that defeats schema caches"}),
            );
        }
    }
    schema
}

fn prompt_for(schema: &Value) -> String {
    let title = schema
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or("JSON object");
    format!(
        "Generate an example of a {title} given the following schema. Answer with the JSON \
         object only.\n\nSchema: {schema}\n"
    )
}

/// The `json` / `json-unique` requests.
pub async fn json_dataset(
    tokenizer: &PromptTokenizer,
    config: &StructuredConfig<'_>,
) -> Result<Vec<RequestInput>, BenchError> {
    if !(0.0..=1.0).contains(&config.ratio) {
        return Err(BenchError::InvalidArgument(format!(
            "--structured-output-ratio must be in [0, 1], got {}",
            config.ratio
        )));
    }
    let schemas = match config.schema_path {
        Some(path) => vec![read_schema(path)?],
        None => builtin_schemas(),
    };
    let mut requests = Vec::with_capacity(config.num_requests);
    for index in 0..config.num_requests {
        let base = &schemas[index % schemas.len()];
        let schema = if config.unique {
            uniquified(base, config.seed, index)
        } else {
            base.clone()
        };
        let prompt = prompt_for(&schema);
        let prompt_len = tokenizer.count(&prompt).await? + tokenizer.num_special_tokens();
        let mut rng = request_rng(config.seed ^ 0x4a53_4f4e, index as u64);
        let constrained = rng.random::<f64>() < config.ratio;
        requests.push(RequestInput {
            prompt,
            prompt_len,
            output_len: config.output_len,
            json_schema: constrained.then(|| Arc::new(schema)),
        });
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ratio: f64, unique: bool) -> StructuredConfig<'static> {
        StructuredConfig {
            num_requests: 8,
            output_len: 200,
            ratio,
            unique,
            schema_path: None,
            seed: 3,
        }
    }

    #[tokio::test]
    async fn every_request_carries_a_valid_schema_it_is_asked_for() {
        let tokenizer = PromptTokenizer::approximate();
        let requests = json_dataset(&tokenizer, &config(1.0, false)).await.unwrap();
        assert_eq!(requests.len(), 8);
        for (index, request) in requests.iter().enumerate() {
            let schema = request
                .json_schema
                .as_deref()
                .expect("ratio 1 constrains all");
            assert_eq!(schema, &builtin_schemas()[index % 4]);
            assert!(request.prompt.contains(&schema.to_string()));
            assert!(jsonschema::meta::is_valid(schema), "{schema}");
            assert_eq!(request.output_len, 200);
        }
        let none = json_dataset(&tokenizer, &config(0.0, false)).await.unwrap();
        assert!(none.iter().all(|r| r.json_schema.is_none()));
        assert_eq!(
            none.iter().map(|r| &r.prompt).collect::<Vec<_>>(),
            requests.iter().map(|r| &r.prompt).collect::<Vec<_>>(),
            "the unconstrained load sends the same prompts"
        );
    }

    #[tokio::test]
    async fn unique_schemas_differ_and_still_accept_the_base_examples() {
        let tokenizer = PromptTokenizer::approximate();
        let requests = json_dataset(&tokenizer, &config(1.0, true)).await.unwrap();
        let texts: std::collections::HashSet<String> = requests
            .iter()
            .filter_map(|r| r.json_schema.as_ref().map(|s| s.to_string()))
            .collect();
        assert_eq!(texts.len(), 8);
        let example = json!({"kind": "view", "payload": 7, "retries": 0});
        let schema = requests[2].json_schema.as_deref().unwrap();
        assert!(jsonschema::is_valid(schema, &example));
    }

    #[tokio::test]
    async fn a_ratio_outside_the_unit_interval_is_refused() {
        let tokenizer = PromptTokenizer::approximate();
        assert!(json_dataset(&tokenizer, &config(1.5, false)).await.is_err());
    }
}
