//! The structured-output check of the `json` datasets: every constrained request's output must
//! parse as JSON and validate against the schema it was sent with (checked with an independent
//! validator, the `jsonschema` crate, not with the server's grammar engine).

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::client::{RequestInput, RequestOutcome};

/// Counts over the constrained requests of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StructuredCheck {
    /// Requests sent with a schema.
    pub constrained: usize,
    /// Of those, the ones that completed.
    pub completed: usize,
    /// Completed outputs that parse as JSON.
    pub valid_json: usize,
    /// Outputs that also validate against their request's schema.
    pub valid: usize,
}

impl StructuredCheck {
    /// Valid outputs over constrained requests, in percent (a failed request counts as wrong).
    pub fn correct_rate(&self) -> f64 {
        if self.constrained == 0 {
            return 0.0;
        }
        self.valid as f64 * 100.0 / self.constrained as f64
    }

    /// Checks `outcomes` against `requests` (same order); `None` when no request had a schema.
    pub fn of(requests: &[RequestInput], outcomes: &[RequestOutcome]) -> Option<Self> {
        let mut check = StructuredCheck::default();
        let mut validators: HashMap<String, Option<jsonschema::Validator>> = HashMap::new();
        for (request, outcome) in requests.iter().zip(outcomes) {
            let Some(schema) = &request.json_schema else {
                continue;
            };
            check.constrained += 1;
            if !outcome.success {
                continue;
            }
            check.completed += 1;
            let Ok(output) = serde_json::from_str::<Value>(outcome.generated_text.trim()) else {
                continue;
            };
            check.valid_json += 1;
            let validator = validators
                .entry(schema.to_string())
                .or_insert_with(|| jsonschema::validator_for(schema).ok());
            if validator.as_ref().is_some_and(|v| v.is_valid(&output)) {
                check.valid += 1;
            }
        }
        (check.constrained > 0).then_some(check)
    }

    /// The section printed under the result block.
    pub fn format(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{:-^50}", "Structured Outputs");
        let _ = writeln!(
            out,
            "{:<40} {:<10}",
            "Constrained requests:", self.constrained
        );
        let _ = writeln!(
            out,
            "{:<40} {:<10}",
            "Outputs that parse as JSON:", self.valid_json
        );
        let _ = writeln!(
            out,
            "{:<40} {:<10}",
            "Outputs valid against schema:", self.valid
        );
        let _ = writeln!(
            out,
            "{:<40} {:<10.2}",
            "Correct rate (%):",
            self.correct_rate()
        );
        let _ = writeln!(out, "{}", "=".repeat(50));
        out
    }

    /// Result-JSON keys (`correct_rate(%)` is the key vLLM's structured benchmark writes).
    pub fn insert_into(&self, result: &mut Map<String, Value>) {
        result.insert("structured_requests".into(), json!(self.constrained));
        result.insert("structured_completed".into(), json!(self.completed));
        result.insert("structured_valid_json".into(), json!(self.valid_json));
        result.insert("structured_valid".into(), json!(self.valid));
        result.insert("correct_rate(%)".into(), json!(self.correct_rate()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn request(schema: Option<Value>) -> RequestInput {
        RequestInput {
            prompt: "p".into(),
            prompt_len: 1,
            output_len: 8,
            json_schema: schema.map(Arc::new),
        }
    }

    fn outcome(success: bool, text: &str) -> RequestOutcome {
        RequestOutcome {
            success,
            generated_text: text.into(),
            ..Default::default()
        }
    }

    #[test]
    fn counts_parse_and_schema_failures_separately() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}},
                            "required": ["n"]});
        let requests = vec![
            request(Some(schema.clone())),
            request(Some(schema.clone())),
            request(Some(schema.clone())),
            request(Some(schema)),
            request(None),
        ];
        let outcomes = vec![
            outcome(true, " {\"n\": 2}\n"),
            outcome(true, "{\"n\": 7}"),
            outcome(true, "{\"n\": 2"),
            outcome(false, ""),
            outcome(true, "not json at all"),
        ];
        let check = StructuredCheck::of(&requests, &outcomes).unwrap();
        assert_eq!(
            check,
            StructuredCheck {
                constrained: 4,
                completed: 3,
                valid_json: 2,
                valid: 1
            }
        );
        assert_eq!(check.correct_rate(), 25.0);
        assert!(check
            .format()
            .contains("Correct rate (%):                        25.00"));
        let mut result = Map::new();
        check.insert_into(&mut result);
        assert_eq!(result["correct_rate(%)"], json!(25.0));
        assert_eq!(StructuredCheck::of(&requests[4..], &outcomes[4..]), None);
    }
}
