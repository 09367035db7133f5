//! `GET /v1/models`, `POST /tokenize`, `POST /detokenize` and `GET /version` payloads.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::chat::{
    conversation, template_options, ChatMessage, ChatTemplateOptions, ConversationMessage,
};
use crate::error::ProtocolError;
use crate::sampling::ValidationLimits;

/// One served model name (each `--served-model-name` alias gets its own card).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// The model the alias serves (path or repo id).
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub max_model_len: Option<u32>,
    #[serde(default)]
    pub permission: Vec<serde_json::Value>,
    /// The model's architecture (`llama`, `qwen3`, `gemma3`, ...): a tokenmill extension,
    /// so clients can tell the family without loading the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}

impl ModelCard {
    pub const OBJECT: &'static str = "model";
    pub const OWNER: &'static str = "tokenmill";

    /// A card owned by `tokenmill` with an empty permission list.
    pub fn new(id: String, created: u64, root: String, max_model_len: u32) -> Self {
        Self {
            id,
            object: Self::OBJECT.to_string(),
            created,
            owned_by: Self::OWNER.to_string(),
            root: Some(root),
            parent: None,
            max_model_len: Some(max_model_len),
            permission: Vec::new(),
            architecture: None,
        }
    }

    /// The card naming the architecture that serves it.
    pub fn with_architecture(self, architecture: &str) -> Self {
        Self {
            architecture: Some(architecture.to_string()),
            ..self
        }
    }
}

/// `GET /v1/models` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

impl ModelList {
    pub fn new(data: Vec<ModelCard>) -> Self {
        Self {
            object: "list".to_string(),
            data,
        }
    }
}

/// `POST /tokenize`, completion form: tokenize a raw prompt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeCompletionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub prompt: String,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_token_strs: Option<bool>,
}

/// `POST /tokenize`, chat form: render `messages` with the chat template, then tokenize.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeChatRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_token_strs: Option<bool>,
}

/// `POST /tokenize` body: the chat form when `messages` is present, else the completion form.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TokenizeRequest {
    Completion(TokenizeCompletionRequest),
    Chat(TokenizeChatRequest),
}

impl<'de> Deserialize<'de> for TokenizeRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let is_chat = value
            .get("messages")
            .is_some_and(|messages| !messages.is_null());
        if is_chat {
            serde_json::from_value(value)
                .map(Self::Chat)
                .map_err(D::Error::custom)
        } else if value.get("prompt").is_some_and(|prompt| !prompt.is_null()) {
            serde_json::from_value(value)
                .map(Self::Completion)
                .map_err(D::Error::custom)
        } else {
            Err(D::Error::custom(
                "tokenize needs either `prompt` or `messages`",
            ))
        }
    }
}

/// What the server must do for a `/tokenize` request, after checking.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeInput {
    Prompt {
        text: String,
        add_special_tokens: bool,
    },
    Chat {
        messages: Vec<ConversationMessage>,
        template: ChatTemplateOptions,
        add_special_tokens: bool,
    },
}

impl TokenizeRequest {
    pub fn model(&self) -> Option<&str> {
        match self {
            Self::Completion(request) => request.model.as_deref(),
            Self::Chat(request) => request.model.as_deref(),
        }
    }

    pub fn return_token_strs(&self) -> bool {
        match self {
            Self::Completion(request) => request.return_token_strs,
            Self::Chat(request) => request.return_token_strs,
        }
        .unwrap_or(false)
    }

    /// The checked input with defaults applied (completion form adds special tokens by
    /// default; chat form leaves them to the template).
    pub fn input(&self) -> Result<TokenizeInput, ProtocolError> {
        match self {
            Self::Completion(request) => Ok(TokenizeInput::Prompt {
                text: request.prompt.clone(),
                add_special_tokens: request.add_special_tokens.unwrap_or(true),
            }),
            Self::Chat(request) => {
                let messages = conversation(&request.messages)?;
                let mut template = template_options(
                    request.add_generation_prompt,
                    request.continue_final_message,
                    request.chat_template.as_ref(),
                    request.chat_template_kwargs.as_ref(),
                    &request.messages,
                )?;
                if let Some(tools) = &request.tools {
                    // The same check as chat completions: each one a named function tool.
                    crate::tools::parse_tools(tools)?;
                }
                template.tools = request.tools.clone();
                Ok(TokenizeInput::Chat {
                    messages,
                    template,
                    add_special_tokens: request.add_special_tokens.unwrap_or(false),
                })
            }
        }
    }
}

/// `POST /tokenize` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: u32,
    pub tokens: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

impl DetokenizeRequest {
    /// Rejects token ids outside the vocabulary.
    pub fn validate(&self, limits: &ValidationLimits) -> Result<(), ProtocolError> {
        self.validate_vocabulary(limits.vocab_size)
    }

    /// Rejects token ids at or above `vocab_size`.
    pub fn validate_vocabulary(&self, vocab_size: u32) -> Result<(), ProtocolError> {
        match self.tokens.iter().find(|&&id| id >= vocab_size) {
            Some(id) => Err(ProtocolError::invalid(
                "tokens",
                format!("Token id {id} is out of vocabulary (size {vocab_size})."),
            )),
            None => Ok(()),
        }
    }
}

/// `POST /detokenize` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// `GET /version` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionResponse {
    pub version: String,
}
