//! Pooling routes' wire types, in vLLM's shapes: `POST /v1/embeddings` (OpenAI's),
//! `/pooling`, `/score`, `/rerank` (`/v1/rerank`, `/v2/rerank`: Jina/Cohere's) and
//! `/classify`, plus the checks that need no tokenizer.

use base64::Engine as _;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::common::random_hex_id;
use crate::completion::PromptInput;
use crate::error::ProtocolError;

/// `encoding_format`: a JSON array of floats, or base64 of the little-endian f32 bytes (what
/// the `openai` client asks for by default and decodes with numpy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// `POST /v1/embeddings` and `POST /pooling`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(deserialize_with = "input_field")]
    pub input: PromptInput,
    #[serde(default, deserialize_with = "encoding_format_field")]
    pub encoding_format: Option<EncodingFormat>,
    /// Matryoshka truncation: only for models that support it (vLLM's rule); others get a 400.
    #[serde(default)]
    pub dimensions: Option<u32>,
    /// Accepted as OpenAI's end-user id; not used for anything (as in vLLM).
    #[serde(default)]
    pub user: Option<String>,
    /// Keep at most this many tokens per input (`-1`: the model length).
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    /// Add the tokenizer's special tokens (`[CLS]`, `[SEP]`) around text inputs (default true).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// L2-normalize the vector; default: as the model's sentence-transformers modules say.
    #[serde(default)]
    pub normalize: Option<bool>,
}

/// `input` has `prompt`'s shapes (texts or token ids, one kind per list); errors name `input`.
fn input_field<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PromptInput, D::Error> {
    PromptInput::deserialize(deserializer)
        .map_err(|error| D::Error::custom(error.to_string().replace("`prompt`", "`input`")))
}

fn encoding_format_field<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<EncodingFormat>, D::Error> {
    match Option::<String>::deserialize(deserializer)?.as_deref() {
        None => Ok(None),
        Some("float") => Ok(Some(EncodingFormat::Float)),
        Some("base64") => Ok(Some(EncodingFormat::Base64)),
        Some(other) => Err(D::Error::custom(format!(
            "`encoding_format` must be \"float\" or \"base64\", got {other:?}"
        ))),
    }
}

/// `text_1` / `text_2` of `/score`: one text or a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ScoreInput {
    Text(String),
    Texts(Vec<String>),
}

impl ScoreInput {
    fn texts(&self) -> Vec<&str> {
        match self {
            ScoreInput::Text(text) => vec![text.as_str()],
            ScoreInput::Texts(texts) => texts.iter().map(String::as_str).collect(),
        }
    }
}

/// `POST /score`.
#[derive(Debug, Clone, Deserialize)]
pub struct ScoreRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub text_1: ScoreInput,
    pub text_2: ScoreInput,
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
}

impl ScoreRequest {
    /// The pairs to score, vLLM's rule: one `text_1` against every `text_2` (1:N), or two
    /// lists of the same length pairwise (N:N).
    pub fn pairs(&self) -> Result<Vec<(String, String)>, ProtocolError> {
        let (first, second) = (self.text_1.texts(), self.text_2.texts());
        if first.is_empty() || second.is_empty() {
            return Err(ProtocolError::invalid(
                if first.is_empty() { "text_1" } else { "text_2" },
                "at least one text is required",
            ));
        }
        let pairs = if first.len() == 1 {
            second
                .iter()
                .map(|b| (first[0].to_string(), b.to_string()))
                .collect()
        } else if first.len() == second.len() {
            first
                .iter()
                .zip(&second)
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        } else {
            return Err(ProtocolError::invalid(
                "text_2",
                format!(
                    "text_1 has {} texts and text_2 {}: give one text_1, or lists of the same \
                     length",
                    first.len(),
                    second.len()
                ),
            ));
        };
        Ok(pairs)
    }
}

/// `POST /rerank`, `/v1/rerank`, `/v2/rerank`.
#[derive(Debug, Clone, Deserialize)]
pub struct RerankRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// Return only the best `top_n` (absent or 0: all).
    #[serde(default)]
    pub top_n: Option<usize>,
    /// Echo each document's text (default true).
    #[serde(default)]
    pub return_documents: Option<bool>,
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
}

/// `POST /classify`.
#[derive(Debug, Clone, Deserialize)]
pub struct ClassifyRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(deserialize_with = "input_field")]
    pub input: PromptInput,
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
}

/// The token limit `truncate_prompt_tokens` asks for: `None` (no truncation), `-1` (the
/// model length) or `1..=max_model_len`; anything else is vLLM's 400.
pub fn truncation_limit(
    truncate_prompt_tokens: Option<i64>,
    max_model_len: usize,
) -> Result<Option<usize>, ProtocolError> {
    match truncate_prompt_tokens {
        None => Ok(None),
        Some(-1) => Ok(Some(max_model_len)),
        Some(k) if k >= 1 && (k as u64) <= max_model_len as u64 => Ok(Some(k as usize)),
        Some(k) if k >= 1 => Err(ProtocolError::invalid(
            "truncate_prompt_tokens",
            format!(
                "truncate_prompt_tokens value ({k}) is greater than max_model_len \
                 ({max_model_len}). Please, select a smaller truncation size."
            ),
        )),
        Some(k) => Err(ProtocolError::invalid(
            "truncate_prompt_tokens",
            format!("truncate_prompt_tokens must be -1 or at least 1, got {k}"),
        )),
    }
}

/// vLLM's 400 for an input longer than the model without truncation.
pub fn input_too_long(param: &str, tokens: usize, max_model_len: usize) -> ProtocolError {
    ProtocolError::ContextLengthExceeded {
        param: param.to_string(),
        message: format!(
            "This model's maximum context length is {max_model_len} tokens. However, you \
             requested {tokens} tokens in the input for embedding generation. Please reduce \
             the length of the input (or set truncate_prompt_tokens)."
        ),
    }
}

/// `usage` of pooling responses: prompt tokens only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
}

impl PoolingUsage {
    pub fn prompt(tokens: usize) -> PoolingUsage {
        let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        PoolingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
            completion_tokens: 0,
        }
    }
}

/// A vector on the wire: floats, or base64 of little-endian f32.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum WireVector {
    Float(Vec<f32>),
    Base64(String),
}

impl WireVector {
    pub fn encode(vector: Vec<f32>, format: EncodingFormat) -> WireVector {
        match format {
            EncodingFormat::Float => WireVector::Float(vector),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                WireVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }
}

/// One vector of an embeddings or pooling response.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingData {
    pub index: usize,
    /// `embedding` (`/v1/embeddings`) or `pooling` (`/pooling`).
    pub object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding: Option<WireVector>,
    /// `/pooling` names the vector `data`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<WireVector>,
}

/// `/v1/embeddings` and `/pooling` responses (`object: list`).
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<EmbeddingData>,
    pub usage: PoolingUsage,
}

impl EmbeddingResponse {
    /// `embd-…` for `/v1/embeddings`, `pool-…` for `/pooling`.
    pub fn new(
        pooling_route: bool,
        model: String,
        created: u64,
        vectors: Vec<WireVector>,
        prompt_tokens: usize,
    ) -> EmbeddingResponse {
        let data = vectors
            .into_iter()
            .enumerate()
            .map(|(index, vector)| EmbeddingData {
                index,
                object: if pooling_route {
                    "pooling"
                } else {
                    "embedding"
                },
                embedding: (!pooling_route).then(|| vector.clone()),
                data: pooling_route.then_some(vector),
            })
            .collect();
        EmbeddingResponse {
            id: format!(
                "{}-{}",
                if pooling_route { "pool" } else { "embd" },
                random_hex_id()
            ),
            object: "list",
            created,
            model,
            data,
            usage: PoolingUsage::prompt(prompt_tokens),
        }
    }
}

/// One score of a `/score` response.
#[derive(Debug, Clone, Serialize)]
pub struct ScoreData {
    pub index: usize,
    pub object: &'static str,
    pub score: f64,
}

/// `/score` response.
#[derive(Debug, Clone, Serialize)]
pub struct ScoreResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<ScoreData>,
    pub usage: PoolingUsage,
}

impl ScoreResponse {
    pub fn new(model: String, created: u64, scores: &[f64], prompt_tokens: usize) -> ScoreResponse {
        ScoreResponse {
            id: format!("score-{}", random_hex_id()),
            object: "list",
            created,
            model,
            data: scores
                .iter()
                .enumerate()
                .map(|(index, &score)| ScoreData {
                    index,
                    object: "score",
                    score,
                })
                .collect(),
            usage: PoolingUsage::prompt(prompt_tokens),
        }
    }
}

/// A document echoed in a rerank result.
#[derive(Debug, Clone, Serialize)]
pub struct RerankDocument {
    pub text: String,
}

/// One result of a rerank response.
#[derive(Debug, Clone, Serialize)]
pub struct RerankResult {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
    pub relevance_score: f64,
}

/// `usage` of a rerank response (Jina/Cohere: total tokens only).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RerankUsage {
    pub total_tokens: u32,
}

/// `/rerank` response: results best first.
#[derive(Debug, Clone, Serialize)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    pub results: Vec<RerankResult>,
}

impl RerankResponse {
    /// Orders `scores` (one per document) best first, keeps `top_n` (0 or absent: all).
    pub fn new(
        model: String,
        request: &RerankRequest,
        scores: &[f64],
        prompt_tokens: usize,
    ) -> RerankResponse {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let keep = match request.top_n {
            Some(n) if n > 0 => n.min(order.len()),
            _ => order.len(),
        };
        let return_documents = request.return_documents.unwrap_or(true);
        let results = order[..keep]
            .iter()
            .map(|&index| RerankResult {
                index,
                document: return_documents.then(|| RerankDocument {
                    text: request.documents[index].clone(),
                }),
                relevance_score: scores[index],
            })
            .collect();
        RerankResponse {
            id: format!("rerank-{}", random_hex_id()),
            model,
            usage: RerankUsage {
                total_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
            },
            results,
        }
    }
}

/// One input's classification.
#[derive(Debug, Clone, Serialize)]
pub struct ClassifyData {
    pub index: usize,
    pub label: String,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}

/// `/classify` response.
#[derive(Debug, Clone, Serialize)]
pub struct ClassifyResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<ClassifyData>,
    pub usage: PoolingUsage,
}

impl ClassifyResponse {
    pub fn new(
        model: String,
        created: u64,
        data: Vec<ClassifyData>,
        prompt_tokens: usize,
    ) -> ClassifyResponse {
        ClassifyResponse {
            id: format!("classify-{}", random_hex_id()),
            object: "list",
            created,
            model,
            data,
            usage: PoolingUsage::prompt(prompt_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(text_1: ScoreInput, text_2: ScoreInput) -> ScoreRequest {
        ScoreRequest {
            model: None,
            text_1,
            text_2,
            truncate_prompt_tokens: None,
        }
    }

    #[test]
    fn score_pairs_follow_vllm() {
        let one = ScoreInput::Text("q".into());
        let many = ScoreInput::Texts(vec!["a".into(), "b".into()]);
        assert_eq!(score(one.clone(), many.clone()).pairs().unwrap().len(), 2);
        assert_eq!(
            score(many.clone(), many.clone()).pairs().unwrap()[1],
            ("b".to_string(), "b".to_string())
        );
        let three = ScoreInput::Texts(vec!["x".into(), "y".into(), "z".into()]);
        assert!(score(many.clone(), three).pairs().is_err());
        assert!(score(ScoreInput::Texts(vec![]), one).pairs().is_err());
    }

    #[test]
    fn truncation_limits() {
        assert_eq!(truncation_limit(None, 8).unwrap(), None);
        assert_eq!(truncation_limit(Some(-1), 8).unwrap(), Some(8));
        assert_eq!(truncation_limit(Some(3), 8).unwrap(), Some(3));
        assert!(truncation_limit(Some(9), 8).is_err());
        assert!(truncation_limit(Some(0), 8).is_err());
        assert!(truncation_limit(Some(-2), 8).is_err());
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let WireVector::Base64(text) = WireVector::encode(vec![1.0, -2.5], EncodingFormat::Base64)
        else {
            panic!("expected base64");
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }

    #[test]
    fn rerank_orders_and_cuts() {
        let request = RerankRequest {
            model: None,
            query: "q".into(),
            documents: vec!["a".into(), "b".into(), "c".into()],
            top_n: Some(2),
            return_documents: Some(false),
            truncate_prompt_tokens: None,
        };
        let response = RerankResponse::new("m".into(), &request, &[0.1, 0.9, 0.5], 7);
        let order: Vec<usize> = response.results.iter().map(|r| r.index).collect();
        assert_eq!(order, [1, 2]);
        assert!(response.results[0].document.is_none());
    }
}
