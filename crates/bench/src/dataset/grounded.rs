//! `input_grounded` (a tokenmill dataset): prompts whose answer repeats long spans of the
//! prompt, the workload speculative decoding's `ngram` and `suffix` methods are for. Half are
//! code edits (a generated Python module, then "rename this function and output the whole
//! file"), half quotes from context (paragraphs of the built-in corpus, then "quote the
//! paragraph that begins with ... exactly"). Deterministic for a seed.

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;

use super::request_rng;
use crate::client::RequestInput;
use crate::corpus;
use crate::error::BenchError;
use crate::tokenize::PromptTokenizer;

/// Identifiers for generated code: ordinary corpus words, lower-cased and letters only.
fn identifiers() -> Vec<String> {
    let mut words: Vec<String> = corpus::words()
        .iter()
        .map(|w| {
            w.chars()
                .filter(char::is_ascii_alphabetic)
                .collect::<String>()
                .to_lowercase()
        })
        .filter(|w| w.len() >= 3)
        .collect();
    words.sort_unstable();
    words.dedup();
    words
}

/// A Python module of four to six small functions, and the name of one of them.
fn code_module(names: &[String], rng: &mut StdRng) -> (String, String) {
    let pick = |rng: &mut StdRng| names.choose(rng).cloned().unwrap_or_default();
    let mut module = String::from("import math\n\n\n");
    let mut functions = Vec::new();
    for _ in 0..rng.random_range(4..=6) {
        let (name, a, b) = (pick(rng), pick(rng), pick(rng));
        let constant = rng.random_range(2..100);
        module.push_str(&format!(
            "def {name}_{a}({a}, {b}):\n    \"\"\"Return the {name} of {a} and {b}.\"\"\"\n    \
             total = {a} * {constant} + {b}\n    if total > {constant}:\n        \
             return math.sqrt(total)\n    return total - {b}\n\n\n"
        ));
        functions.push(format!("{name}_{a}"));
    }
    let target = functions.choose(rng).cloned().unwrap_or_default();
    (module, target)
}

fn code_edit_prompt(names: &[String], rng: &mut StdRng) -> String {
    let (module, target) = code_module(names, rng);
    let new_name = format!(
        "{target}_{}",
        names.choose(rng).map_or("v2", String::as_str)
    );
    format!(
        "Here is a Python file:\n\n```python\n{module}```\n\nRename the function `{target}` to \
         `{new_name}` and output the whole updated file, unchanged otherwise, in one code block."
    )
}

fn quote_prompt(rng: &mut StdRng) -> String {
    let mut paragraphs: Vec<&str> = corpus::CORPUS.lines().filter(|l| !l.is_empty()).collect();
    paragraphs.shuffle(rng);
    let context: Vec<&str> = paragraphs.iter().take(4).copied().collect();
    let chosen = context.choose(rng).copied().unwrap_or_default();
    let opening: String = chosen
        .split_whitespace()
        .take(6)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "Context:\n\n{}\n\nQuote, word for word, the whole paragraph of the context that begins \
         with \"{opening}\". Output only the quoted paragraph.",
        context.join("\n\n")
    )
}

/// `num_requests` prompts alternating code edits and quotes, each asking for `output_len`
/// tokens; prompt lengths are counted with `tokenizer`.
pub async fn input_grounded(
    tokenizer: &PromptTokenizer,
    num_requests: usize,
    output_len: usize,
    seed: u64,
) -> Result<Vec<RequestInput>, BenchError> {
    let names = identifiers();
    let mut requests = Vec::with_capacity(num_requests);
    for index in 0..num_requests {
        let mut rng = request_rng(seed ^ 0x4752_4e44, index as u64);
        let prompt = if index % 2 == 0 {
            code_edit_prompt(&names, &mut rng)
        } else {
            quote_prompt(&mut rng)
        };
        let prompt_len = tokenizer.count(&prompt).await? + tokenizer.num_special_tokens();
        requests.push(RequestInput {
            prompt,
            prompt_len,
            output_len,
            json_schema: None,
        });
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn prompts_are_grounded_alternating_and_reproducible() {
        let tokenizer = PromptTokenizer::approximate();
        let requests = input_grounded(&tokenizer, 4, 64, 7).await.unwrap();
        assert_eq!(requests.len(), 4);
        assert!(requests[0].prompt.contains("```python\nimport math"));
        assert!(requests[0].prompt.contains("output the whole updated file"));
        assert!(requests[1].prompt.starts_with("Context:"));
        // The paragraph to quote is in the context.
        let opening = requests[1].prompt.rsplit("begins with \"").next().unwrap();
        let opening = opening.split('"').next().unwrap();
        assert!(
            requests[1].prompt.matches(opening).count() >= 2,
            "{opening}"
        );
        assert!(requests
            .iter()
            .all(|r| r.output_len == 64 && r.prompt_len > 50));
        let again = input_grounded(&tokenizer, 4, 64, 7).await.unwrap();
        assert_eq!(
            requests.iter().map(|r| &r.prompt).collect::<Vec<_>>(),
            again.iter().map(|r| &r.prompt).collect::<Vec<_>>()
        );
    }
}
