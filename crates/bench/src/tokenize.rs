//! Where prompt token counts come from: a local tokenizer.json, the server's tokenize and
//! detokenize endpoints, or (when neither exists) an approximate word-based construction.

use std::path::Path;

use serde_json::{json, Value};

use crate::corpus;
use crate::error::BenchError;

/// Which tokenize API a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerDialect {
    /// vLLM: POST /tokenize {"model","prompt"} → {"tokens"}; /detokenize {"model","tokens"}
    /// → {"prompt"}.
    Vllm { honours_add_special_tokens: bool },
    /// llama-cpp-python: POST /extras/tokenize {"input"} → {"tokens"};
    /// /extras/detokenize {"tokens"} → {"text"}.
    LlamaCppPython,
}

#[derive(Debug, Clone)]
struct ServerTokenizer {
    http: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
    dialect: ServerDialect,
    /// Tokens the server adds to an empty prompt (BOS); stripped when it cannot be told not to.
    special_prefix: Vec<u32>,
}

impl ServerTokenizer {
    async fn post(&self, path: &str, body: Value) -> Result<Value, BenchError> {
        let url = format!("{}{}", self.base_url, path);
        let mut request = self.http.post(&url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|source| BenchError::Http {
            url: url.clone(),
            source,
        })?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(BenchError::Server {
                url,
                status: status.as_u16(),
                body: body.chars().take(300).collect(),
            });
        }
        response
            .json::<Value>()
            .await
            .map_err(|source| BenchError::Http { url, source })
    }

    async fn tokenize_raw(
        &self,
        text: &str,
        without_special: bool,
    ) -> Result<Vec<u32>, BenchError> {
        let (path, body) = match self.dialect {
            ServerDialect::Vllm {
                honours_add_special_tokens,
            } => {
                let mut body = json!({"model": self.model, "prompt": text});
                if without_special && honours_add_special_tokens {
                    body["add_special_tokens"] = Value::Bool(false);
                }
                ("/tokenize", body)
            }
            ServerDialect::LlamaCppPython => ("/extras/tokenize", json!({"input": text})),
        };
        let answer = self.post(path, body).await?;
        token_list(&answer).ok_or_else(|| {
            BenchError::Tokenizer(format!("{path} answered without a token list: {answer}"))
        })
    }

    async fn encode(&self, text: &str) -> Result<Vec<u32>, BenchError> {
        let mut tokens = self.tokenize_raw(text, true).await?;
        let strips = !matches!(
            self.dialect,
            ServerDialect::Vllm {
                honours_add_special_tokens: true
            }
        );
        if strips && !self.special_prefix.is_empty() && tokens.starts_with(&self.special_prefix) {
            tokens.drain(..self.special_prefix.len());
        }
        Ok(tokens)
    }

    async fn decode(&self, tokens: &[u32]) -> Result<String, BenchError> {
        let (path, body, field) = match self.dialect {
            ServerDialect::Vllm { .. } => (
                "/detokenize",
                json!({"model": self.model, "tokens": tokens}),
                "prompt",
            ),
            ServerDialect::LlamaCppPython => {
                ("/extras/detokenize", json!({"tokens": tokens}), "text")
            }
        };
        let answer = self.post(path, body).await?;
        answer
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                BenchError::Tokenizer(format!("{path} answered without \"{field}\": {answer}"))
            })
    }
}

fn token_list(answer: &Value) -> Option<Vec<u32>> {
    answer
        .get("tokens")?
        .as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect()
}

#[derive(Debug, Clone)]
enum Backend {
    Local(Box<tokenizers::Tokenizer>),
    Server(ServerTokenizer),
    Approximate,
}

/// Encodes and decodes prompts so datasets can build them with exact token lengths.
#[derive(Debug, Clone)]
pub struct PromptTokenizer {
    backend: Backend,
    /// Ordinary (non-special) token ids random prompts are drawn from, sorted.
    allowed_tokens: Vec<u32>,
    /// Tokens the server adds around a prompt (BOS): random prompts are that much shorter so
    /// the served prompt has the requested length, as vLLM does.
    num_special_tokens: usize,
    description: String,
}

/// How to reach the server for its tokenizer.
#[derive(Debug, Clone)]
pub struct ServerAccess {
    pub http: reqwest::Client,
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
}

impl PromptTokenizer {
    /// A tokenizer.json on disk.
    pub fn from_file(path: &Path) -> Result<Self, BenchError> {
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|err| BenchError::Tokenizer(format!("{}: {err}", path.display())))?;
        let special: std::collections::HashSet<u32> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let vocab_size = tokenizer.get_vocab_size(false) as u32;
        let allowed_tokens: Vec<u32> = (0..vocab_size).filter(|id| !special.contains(id)).collect();
        let num_special_tokens = tokenizer
            .encode("", true)
            .map_err(|err| BenchError::Tokenizer(err.to_string()))?
            .get_ids()
            .len();
        if allowed_tokens.is_empty() {
            return Err(BenchError::Tokenizer(format!(
                "{}: empty vocabulary",
                path.display()
            )));
        }
        Ok(PromptTokenizer {
            backend: Backend::Local(Box::new(tokenizer)),
            allowed_tokens,
            num_special_tokens,
            description: path.display().to_string(),
        })
    }

    /// The server's tokenizer if it exposes one (vLLM or llama-cpp-python style), else the
    /// approximate word-based fallback. Prints which one it uses.
    pub async fn from_server(access: ServerAccess) -> Self {
        match Self::probe_server(access.clone()).await {
            Ok(tokenizer) => {
                println!(
                    "Using the server's tokenizer ({}) to build prompts.",
                    tokenizer.description
                );
                tokenizer
            }
            Err(reason) => {
                println!(
                    "WARNING: no tokenizer available ({reason}); prompts are built from words and \
                     their token counts are approximate. Pass --tokenizer PATH/tokenizer.json for \
                     exact lengths. Input token counts are taken from the server's usage reports."
                );
                Self::approximate()
            }
        }
    }

    /// The fallback: no token ids at all, prompts from words.
    pub fn approximate() -> Self {
        PromptTokenizer {
            backend: Backend::Approximate,
            allowed_tokens: Vec::new(),
            num_special_tokens: 0,
            description: "approximate (words)".into(),
        }
    }

    async fn probe_server(access: ServerAccess) -> Result<Self, String> {
        let candidates = [
            ServerDialect::Vllm {
                honours_add_special_tokens: true,
            },
            ServerDialect::Vllm {
                honours_add_special_tokens: false,
            },
            ServerDialect::LlamaCppPython,
        ];
        let mut last_error = String::from("no tokenize endpoint");
        for dialect in candidates {
            let mut server = ServerTokenizer {
                http: access.http.clone(),
                base_url: access.base_url.clone(),
                model: access.model.clone(),
                api_key: access.api_key.clone(),
                dialect,
                special_prefix: Vec::new(),
            };
            let probe = server.tokenize_raw("Hello world", true).await;
            if let Err(err) = probe {
                last_error = err.to_string();
                continue;
            }
            let special_prefix = server
                .tokenize_raw("", false)
                .await
                .map_err(|e| e.to_string())?;
            server.special_prefix = special_prefix.clone();
            let corpus_tokens = server
                .encode(corpus::CORPUS)
                .await
                .map_err(|e| e.to_string())?;
            let mut allowed_tokens = corpus_tokens;
            allowed_tokens.retain(|id| !special_prefix.contains(id));
            allowed_tokens.sort_unstable();
            allowed_tokens.dedup();
            if allowed_tokens.is_empty() {
                return Err("the server tokenized the built-in corpus to nothing".into());
            }
            let sample: Vec<u32> = allowed_tokens.iter().take(8).copied().collect();
            server
                .decode(&sample)
                .await
                .map_err(|e| format!("detokenize unavailable: {e}"))?;
            let path = match dialect {
                ServerDialect::Vllm { .. } => "/tokenize",
                ServerDialect::LlamaCppPython => "/extras/tokenize",
            };
            return Ok(PromptTokenizer {
                description: format!("{}{path}", access.base_url),
                backend: Backend::Server(server),
                allowed_tokens,
                num_special_tokens: special_prefix.len(),
            });
        }
        Err(last_error)
    }

    /// True when prompt lengths are exact token counts.
    pub fn is_exact(&self) -> bool {
        !matches!(self.backend, Backend::Approximate)
    }

    /// Where tokens come from, for the result file's tokenizer_id.
    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn allowed_tokens(&self) -> &[u32] {
        &self.allowed_tokens
    }

    pub fn num_special_tokens(&self) -> usize {
        self.num_special_tokens
    }

    /// Token ids of `text`, without special tokens.
    pub async fn encode(&self, text: &str) -> Result<Vec<u32>, BenchError> {
        match &self.backend {
            Backend::Local(tokenizer) => tokenizer
                .encode(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|err| BenchError::Tokenizer(err.to_string())),
            Backend::Server(server) => server.encode(text).await,
            Backend::Approximate => Err(BenchError::Tokenizer("no tokenizer available".into())),
        }
    }

    /// Text of `tokens`.
    pub async fn decode(&self, tokens: &[u32]) -> Result<String, BenchError> {
        match &self.backend {
            Backend::Local(tokenizer) => tokenizer
                .decode(tokens, false)
                .map_err(|err| BenchError::Tokenizer(err.to_string())),
            Backend::Server(server) => server.decode(tokens).await,
            Backend::Approximate => Err(BenchError::Tokenizer("no tokenizer available".into())),
        }
    }

    /// Token count of `text`: exact with a tokenizer, about four characters a token without.
    pub async fn count(&self, text: &str) -> Result<usize, BenchError> {
        if self.is_exact() {
            Ok(self.encode(text).await?.len())
        } else {
            Ok(text.chars().count().div_ceil(4).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{random_dataset, RandomConfig};
    use std::collections::HashMap;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::{AddedToken, Tokenizer};

    /// A word-level tokenizer.json: decode joins words with spaces, so text round-trips.
    fn write_word_tokenizer(dir: &tempfile::TempDir) -> std::path::PathBuf {
        let mut vocab: HashMap<String, u32> = HashMap::new();
        for (id, word) in [
            "[UNK]", "apple", "river", "stone", "cloud", "maple", "ember", "frost", "grove",
        ]
        .iter()
        .enumerate()
        {
            vocab.insert((*word).to_string(), id as u32);
        }
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .expect("word level model");
        let mut tokenizer = Tokenizer::new(model);
        tokenizer.with_pre_tokenizer(Some(Whitespace {}));
        tokenizer.add_special_tokens(&[
            AddedToken::from("[UNK]", true),
            AddedToken::from("<eos>", true),
        ]);
        let path = dir.path().join("tokenizer.json");
        tokenizer.save(&path, false).expect("save tokenizer.json");
        path
    }

    #[tokio::test]
    async fn local_tokenizer_json_builds_exact_random_prompts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let tokenizer =
            PromptTokenizer::from_file(&write_word_tokenizer(&dir)).expect("load tokenizer.json");
        assert!(tokenizer.is_exact());
        // Special tokens ([UNK] = 0; <eos> was added past the base vocabulary) are never drawn.
        assert_eq!(tokenizer.allowed_tokens(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(tokenizer.num_special_tokens(), 0);
        let config = RandomConfig {
            num_requests: 30,
            input_len: 24,
            output_len: 4,
            range_ratio: 0.0,
            prefix_len: 0,
            seed: 9,
        };
        let requests = random_dataset(&tokenizer, &config)
            .await
            .expect("random dataset");
        let mut distinct = std::collections::HashSet::new();
        for request in &requests {
            let tokens = tokenizer.encode(&request.prompt).await.expect("encode");
            assert_eq!(tokens.len(), 24);
            assert_eq!(request.prompt_len, 24);
            assert!(tokens.iter().all(|id| (1..=8).contains(id)));
            distinct.insert(request.prompt.clone());
        }
        assert_eq!(distinct.len(), 30);
    }

    #[test]
    fn missing_tokenizer_file_is_an_error() {
        let missing = Path::new("/nonexistent/tokenizer.json");
        assert!(matches!(
            PromptTokenizer::from_file(missing),
            Err(BenchError::Tokenizer(_))
        ));
    }
}
