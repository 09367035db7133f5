//! Datasets read from files: ShareGPT JSON and custom JSONL.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::Value;

use super::oversample;
use crate::client::RequestInput;
use crate::error::BenchError;
use crate::tokenize::PromptTokenizer;

fn dataset_error(path: &Path, message: impl Into<String>) -> BenchError {
    BenchError::Dataset {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// vLLM's pruning of ShareGPT pairs: prompts of 4..=1024 tokens, totals up to 2048, and
/// outputs of at least 4 tokens unless the output length is fixed.
fn is_valid_sequence(
    prompt_len: usize,
    output_len: usize,
    skip_min_output_len_check: bool,
) -> bool {
    let prompt_too_short = prompt_len < 4;
    let output_too_short = !skip_min_output_len_check && output_len < 4;
    !(prompt_too_short || output_too_short || prompt_len > 1024 || prompt_len + output_len > 2048)
}

/// ShareGPT: a JSON array of `{"conversations": [{"value": prompt}, {"value": answer}, ...]}`.
/// Entries are shuffled with the seed; the first turn is the prompt and the reference answer's
/// length is the output length unless `fixed_output_len` is given.
pub async fn load_sharegpt(
    path: &Path,
    tokenizer: &PromptTokenizer,
    num_requests: usize,
    fixed_output_len: Option<usize>,
    seed: u64,
) -> Result<Vec<RequestInput>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::io(path, source))?;
    let data: Value =
        serde_json::from_str(&text).map_err(|err| dataset_error(path, err.to_string()))?;
    let entries = data
        .as_array()
        .ok_or_else(|| dataset_error(path, "expected a JSON array"))?;
    let mut pairs: Vec<(String, String)> = entries
        .iter()
        .filter_map(|entry| {
            let turns = entry.get("conversations")?.as_array()?;
            if turns.len() < 2 {
                return None;
            }
            let turn_text = |turn: &Value| {
                turn.get("value")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            Some((turn_text(&turns[0])?, turn_text(&turns[1])?))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    pairs.shuffle(&mut rng);
    let mut requests = Vec::new();
    for (prompt, completion) in pairs {
        if requests.len() >= num_requests {
            break;
        }
        let prompt_len = tokenizer.count(&prompt).await? + tokenizer.num_special_tokens();
        let output_len = match fixed_output_len {
            Some(len) => len,
            None => tokenizer.count(&completion).await? + tokenizer.num_special_tokens(),
        };
        if !is_valid_sequence(prompt_len, output_len, fixed_output_len.is_some()) {
            continue;
        }
        requests.push(RequestInput {
            prompt,
            prompt_len,
            output_len,
            json_schema: None,
        });
    }
    if requests.is_empty() {
        return Err(dataset_error(
            path,
            "no conversation passed the length filters",
        ));
    }
    oversample(&mut requests, num_requests, &mut rng);
    Ok(requests)
}

/// Custom JSONL: one object per line with a string "prompt" and optionally an integer
/// "output_tokens" or "output_len"; others get `default_output_len`. Lines are shuffled with
/// the seed. Prompts are sent as they are (no client-side chat template).
pub async fn load_custom(
    path: &Path,
    tokenizer: &PromptTokenizer,
    num_requests: usize,
    default_output_len: usize,
    seed: u64,
) -> Result<Vec<RequestInput>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::io(path, source))?;
    let mut items = Vec::new();
    for (line_number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|err| dataset_error(path, format!("line {}: {err}", line_number + 1)))?;
        let prompt = value
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                dataset_error(
                    path,
                    format!("line {}: no string \"prompt\"", line_number + 1),
                )
            })?
            .to_string();
        let output_len = value
            .get("output_tokens")
            .or_else(|| value.get("output_len"))
            .and_then(Value::as_u64)
            .map_or(default_output_len, |n| n as usize);
        items.push((prompt, output_len));
    }
    if items.is_empty() {
        return Err(dataset_error(path, "no prompts"));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    items.shuffle(&mut rng);
    let mut requests = Vec::new();
    for (prompt, output_len) in items.into_iter().take(num_requests) {
        let prompt_len = tokenizer.count(&prompt).await? + tokenizer.num_special_tokens();
        requests.push(RequestInput {
            prompt,
            prompt_len,
            output_len,
            json_schema: None,
        });
    }
    oversample(&mut requests, num_requests, &mut rng);
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write dataset");
        path
    }

    fn words(count: usize) -> String {
        vec!["word"; count].join(" ")
    }

    #[tokio::test]
    async fn sharegpt_filters_like_vllm_and_oversamples() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Approximate counting: ceil(chars / 4) tokens; "word word ..." is 5 chars a word.
        let data = serde_json::json!([
            {"conversations": [{"from": "human", "value": words(40)}, {"from": "gpt", "value": words(20)}]},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": words(20)}]},
            {"conversations": [{"from": "human", "value": words(40)}]},
            {"conversations": [{"from": "human", "value": words(2000)}, {"from": "gpt", "value": words(20)}]},
            {"id": "no conversations"},
            {"conversations": [{"from": "human", "value": words(8)}, {"from": "gpt", "value": "ok"}]},
        ]);
        let path = write(&dir, "sharegpt.json", &data.to_string());
        let tokenizer = PromptTokenizer::approximate();
        let requests = load_sharegpt(&path, &tokenizer, 5, None, 0)
            .await
            .expect("load");
        // Only the first conversation passes: "hi" is too short, one has a single turn, one is
        // too long, and "ok" is too short an answer when the output length is not fixed.
        assert_eq!(requests.len(), 5, "oversampled to the requested count");
        assert!(requests.iter().all(|r| r.prompt == words(40)));
        assert_eq!(requests[0].prompt_len, words(40).len().div_ceil(4));
        assert_eq!(requests[0].output_len, words(20).len().div_ceil(4));

        let fixed = load_sharegpt(&path, &tokenizer, 2, Some(7), 0)
            .await
            .expect("load");
        assert_eq!(fixed.len(), 2);
        assert!(fixed.iter().all(|r| r.output_len == 7));
        let prompts: std::collections::HashSet<&str> =
            fixed.iter().map(|r| r.prompt.as_str()).collect();
        assert_eq!(
            prompts.len(),
            2,
            "with a fixed output length the short answer no longer disqualifies"
        );
    }

    #[tokio::test]
    async fn custom_jsonl_reads_output_lengths() {
        let dir = tempfile::tempdir().expect("temp dir");
        let text = "{\"prompt\": \"alpha\", \"output_tokens\": 5}\n\n{\"prompt\": \"beta\", \"output_len\": 9}\n{\"prompt\": \"gamma\"}\n";
        let path = write(&dir, "custom.jsonl", text);
        let tokenizer = PromptTokenizer::approximate();
        let mut requests = load_custom(&path, &tokenizer, 3, 256, 1)
            .await
            .expect("load");
        requests.sort_by(|a, b| a.prompt.cmp(&b.prompt));
        let summary: Vec<(&str, usize)> = requests
            .iter()
            .map(|r| (r.prompt.as_str(), r.output_len))
            .collect();
        assert_eq!(summary, vec![("alpha", 5), ("beta", 9), ("gamma", 256)]);
        let bad = write(&dir, "bad.jsonl", "{\"text\": \"no prompt\"}\n");
        assert!(matches!(
            load_custom(&bad, &tokenizer, 1, 8, 0).await,
            Err(BenchError::Dataset { .. })
        ));
    }
}
