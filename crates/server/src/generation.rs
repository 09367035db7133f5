//! What completions and chat share: turning a validated request into engine requests,
//! collecting a choice's output, and rendering logprobs.

use std::sync::Arc;
use std::time::Instant;

use std::collections::BTreeMap;
use tokenmill_engine::{
    FinishReason as EngineFinish, GenerateRequest, LoadedModel, RequestEvent, RequestFailure,
    RequestStream, SamplingParams, StopOptions, StopReason as EngineStop, TokenLogprob,
};
use tokenmill_models::{StructuredOutput, ThinkingBudget};

use tokenmill_protocol::{
    ChatLogprobToken, ChatLogprobs, ChatTopLogprob, CompletionLogprobs, ErrorResponse,
    FinishReason, PromptLogprob, PromptLogprobs, StopReason, StructuredConstraint,
    StructuredOutputRequest, ThinkingTokenBudget, TopLogprobMap, ValidatedSampling,
};
use tokenmill_text::{reasoning_markers, DecodeOptions, Tokenizer};

use crate::error::ApiError;
use crate::state::AppState;

/// The engine's sampling parameters for a validated request, built once for all its choices
/// (`bad_words` are tokenized here, where the tokenizer is, and a structured output is compiled
/// here, so a bad schema, regex or grammar is a 400 naming its field before anything is queued).
/// A grammar compiles in the admission pool (`crate::admission`): a large schema must not hold
/// an async worker that other connections share, nor may many of them hold every core.
pub(crate) async fn engine_sampling(
    validated: &ValidatedSampling,
    state: &AppState,
) -> Result<SamplingParams, ApiError> {
    let model = &state.inner.model;
    let reasoning_parser = state.config().reasoning_parser.as_deref();
    let sampling = &validated.sampling;
    let thinking_budget = match sampling.thinking_token_budget {
        Some(budget) => Some(thinking_budget(budget, model, reasoning_parser)?),
        None => None,
    };
    let structured_output = match sampling.structured_output.clone() {
        Some(request) => {
            let model = Arc::clone(model);
            let compiled = state
                .admission()
                .run("grammar compilation", move || {
                    compile_structured_output(&request, &model)
                })
                .await?;
            Some(compiled?)
        }
        None => None,
    };
    let bad_words_token_ids = model
        .tokenizer
        .bad_words_token_ids(&sampling.bad_words)
        .map_err(|e| ApiError::invalid_param("bad_words", e.to_string()))?;
    let params = SamplingParams {
        temperature: sampling.temperature,
        top_k: sampling.top_k.map(|k| k as usize),
        top_p: sampling.top_p,
        min_p: sampling.min_p,
        seed: sampling.seed,
        repetition_penalty: sampling.repetition_penalty,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        logit_bias: sampling.logit_bias.clone(),
        logprobs: sampling.logprobs.map(|k| k as usize),
        allowed_token_ids: sampling.allowed_token_ids.clone(),
        bad_words_token_ids,
        min_tokens: sampling.min_tokens,
        all_stop_token_ids: Vec::new(),
        structured_output,
        thinking_budget,
    };
    // What the engine's `min_tokens` will hold back (its `all_stop_token_ids`): constraints
    // that leave nothing to generate are a 400 here, before anything is queued.
    let mut stop_token_ids = sampling.stop_token_ids.clone();
    if !sampling.ignore_eos {
        stop_token_ids.extend(model.tokenizer.eos_token_ids());
    }
    params
        .check_satisfiable(&stop_token_ids)
        .map_err(|e| ApiError::invalid_param(e.param(), e.to_string()))?;
    Ok(params)
}

/// The engine's thinking budget: the request's token count and the reasoning parser's
/// markers as tokens. Without a reasoning parser the server cannot tell thinking from
/// answer, so a budget is a 400 naming its field rather than a setting silently dropped.
fn thinking_budget(
    budget: ThinkingTokenBudget,
    model: &LoadedModel,
    reasoning_parser: Option<&str>,
) -> Result<ThinkingBudget, ApiError> {
    let param = budget.param;
    let markers = reasoning_parser
        .and_then(reasoning_markers)
        .ok_or_else(|| {
            let why = match reasoning_parser {
                None => "this server runs without a reasoning parser (--reasoning-parser), so it \
                         cannot tell reasoning tokens from the answer"
                    .to_string(),
                Some(name) => format!(
                    "the reasoning parser {name} ends reasoning at a message boundary, not at \
                     one marker the budget could force"
                ),
            };
            ApiError::invalid_param(param, format!("{param}: {why}; leave the budget out"))
        })?;
    let encode = |marker: &str| {
        model
            .tokenizer
            .encode(marker, false)
            .ok()
            .filter(|ids| !ids.is_empty())
            .ok_or_else(|| {
                ApiError::invalid_param(
                    param,
                    format!("{param}: the reasoning marker {marker:?} has no tokens"),
                )
            })
    };
    Ok(ThinkingBudget {
        budget: budget.tokens,
        start_token_ids: encode(markers.start)?,
        end_token_ids: encode(markers.end)?,
        reasoning_without_start: markers.reasoning_without_start,
    })
}

/// The engine's form of a checked wire constraint (also used by `generate --input`).
pub fn structured_output(constraint: &StructuredConstraint) -> StructuredOutput {
    match constraint {
        StructuredConstraint::JsonSchema(schema) => StructuredOutput::JsonSchema(schema.clone()),
        StructuredConstraint::JsonObject => StructuredOutput::JsonObject,
        StructuredConstraint::Regex(regex) => StructuredOutput::Regex(regex.clone()),
        StructuredConstraint::Choice(choices) => StructuredOutput::Choice(choices.clone()),
        StructuredConstraint::Grammar(grammar) => StructuredOutput::Grammar(grammar.clone()),
    }
}

/// The engine's form of a checked constraint, compiled once (the compiled grammar is cached,
/// so the executor's compile in `add_request` is a lookup).
fn compile_structured_output(
    request: &StructuredOutputRequest,
    model: &LoadedModel,
) -> Result<StructuredOutput, ApiError> {
    let output = structured_output(&request.constraint);
    model
        .grammar
        .compile(&output)
        .map_err(|e| ApiError::invalid_param(request.param, format!("{}: {e}", request.param)))?;
    Ok(output)
}

/// One engine request for choice `choice_index` of a prompt, sampling with `params` (from
/// [`engine_sampling`]).
pub(crate) fn engine_request(
    prompt_token_ids: Vec<u32>,
    validated: &ValidatedSampling,
    params: &SamplingParams,
    max_tokens: u32,
    choice_index: u32,
    arrival: Instant,
) -> GenerateRequest {
    let sampling = &validated.sampling;
    // Each choice of a seeded request draws from its own stream, reproducibly.
    let seed = params
        .seed
        .map(|seed| seed.wrapping_add(u64::from(choice_index)));
    GenerateRequest {
        lora: None,
        prompt_token_ids,
        sampling: SamplingParams {
            seed,
            ..params.clone()
        },
        stop: StopOptions {
            max_tokens: Some(max_tokens),
            ignore_eos: sampling.ignore_eos,
            stop_token_ids: sampling.stop_token_ids.clone(),
            stop_strings: sampling.stop.clone(),
            include_stop_str_in_output: sampling.include_stop_str_in_output,
        },
        priority: i32::try_from(validated.output.priority).unwrap_or(
            if validated.output.priority < 0 {
                i32::MIN
            } else {
                i32::MAX
            },
        ),
        cache_salt: validated.output.cache_salt.clone(),
        decode: DecodeOptions {
            skip_special_tokens: sampling.skip_special_tokens,
            spaces_between_special_tokens: sampling.spaces_between_special_tokens,
        },
        prompt_logprobs: sampling.prompt_logprobs.map(|k| k as usize),
        arrival,
    }
}

/// Everything one choice produced.
#[derive(Debug, Default)]
pub(crate) struct ChoiceResult {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    pub num_prompt_tokens: usize,
    pub num_cached_tokens: usize,
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

/// Drains a request's stream into one result (non-streaming responses).
pub(crate) async fn collect(mut stream: RequestStream) -> Result<ChoiceResult, ApiError> {
    let mut result = ChoiceResult::default();
    while let Some(event) = stream.recv().await {
        match event {
            RequestEvent::Output(output) => {
                result.text.push_str(&output.new_text);
                result.token_ids.extend_from_slice(&output.new_token_ids);
                result.logprobs.extend(output.logprobs);
                if output.prompt_logprobs.is_some() {
                    result.prompt_logprobs = output.prompt_logprobs;
                }
                result.num_prompt_tokens = output.num_prompt_tokens;
                result.num_cached_tokens = output.num_cached_tokens;
                if let Some(reason) = output.finish_reason {
                    result.finish_reason = Some(wire_finish_reason(reason));
                    result.stop_reason = output.stop_reason.map(wire_stop_reason);
                }
            }
            RequestEvent::Rejected(message) => return Err(ApiError::invalid(message)),
            RequestEvent::Error(message) => return Err(ApiError::Internal(message)),
            RequestEvent::Failed(failure) => return Err(request_failure(failure)),
        }
    }
    if result.finish_reason.is_none() {
        return Err(ApiError::unavailable(
            "the engine stopped before the request finished",
        ));
    }
    Ok(result)
}

/// A request the engine failed on its own (the others went on): a 500 naming what failed,
/// never the library's message (the engine logged it).
pub(crate) fn request_failure(failure: RequestFailure) -> ApiError {
    ApiError::from(ErrorResponse::internal(failure.message()))
}

pub(crate) fn wire_finish_reason(reason: EngineFinish) -> FinishReason {
    match reason {
        EngineFinish::Stop => FinishReason::Stop,
        EngineFinish::Length => FinishReason::Length,
        EngineFinish::Abort => FinishReason::Abort,
    }
}

pub(crate) fn wire_stop_reason(reason: EngineStop) -> StopReason {
    match reason {
        EngineStop::Token(id) => StopReason::TokenId(id),
        EngineStop::String(text) => StopReason::Text(text),
    }
}

/// The text of one token as it appears in the output (byte-level pieces decoded; a piece
/// that is not valid UTF-8 on its own shows replacement characters, as in vLLM).
pub(crate) fn token_text(tokenizer: &Tokenizer, token_id: u32) -> String {
    match tokenizer.token_to_piece(token_id) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    }
}

fn token_bytes(tokenizer: &Tokenizer, token_id: u32) -> Option<Vec<u8>> {
    tokenizer.token_to_piece(token_id).ok()
}

/// How logprob entries name their tokens: the decoded text, or `token_id:N` under
/// `--return-tokens-as-token-ids` (for clients that must tell apart tokens whose text is not
/// valid UTF-8 on its own). `bytes` stay the token's own bytes either way.
#[derive(Clone, Copy)]
pub(crate) struct TokenNames<'a> {
    pub tokenizer: &'a Tokenizer,
    pub as_ids: bool,
}

impl TokenNames<'_> {
    fn name(&self, token_id: u32) -> String {
        if self.as_ids {
            format!("token_id:{token_id}")
        } else {
            token_text(self.tokenizer, token_id)
        }
    }
}

/// Legacy completions logprobs, appended to `out`: one entry per token, `None` where a token
/// has no logprob (the first prompt token). Offsets continue from `offset` (characters).
/// Like vLLM, each `top_logprobs` map holds the top alternatives plus the token itself.
pub(crate) fn append_completion_logprobs(
    out: &mut CompletionLogprobs,
    names: TokenNames<'_>,
    entries: &[(u32, Option<&TokenLogprob>)],
    offset: &mut u32,
) {
    for &(token_id, entry) in entries {
        let text = names.name(token_id);
        out.text_offset.push(*offset);
        *offset += text.chars().count() as u32;
        out.tokens.push(text.clone());
        out.token_logprobs.push(entry.map(|e| e.logprob));
        out.top_logprobs.push(entry.map(|e| {
            let mut map: Vec<(String, f32)> = e
                .top
                .iter()
                .map(|(id, lp)| (names.name(*id), *lp))
                .collect();
            if !e.top.iter().any(|(id, _)| *id == token_id) {
                map.push((text, e.logprob));
            }
            TopLogprobMap(map)
        }));
    }
}

/// vLLM's `prompt_logprobs` field: per position, token id → logprob (with rank and text).
pub(crate) fn wire_prompt_logprobs(
    tokenizer: &Tokenizer,
    prompt_token_ids: &[u32],
    entries: &[Option<TokenLogprob>],
) -> PromptLogprobs {
    entries
        .iter()
        .zip(prompt_token_ids)
        .map(|(entry, &token_id)| {
            entry.as_ref().map(|e| {
                let mut map = BTreeMap::new();
                for (rank, (id, lp)) in e.top.iter().enumerate() {
                    map.insert(
                        id.to_string(),
                        PromptLogprob {
                            logprob: *lp,
                            rank: Some(rank as u32 + 1),
                            decoded_token: Some(token_text(tokenizer, *id)),
                        },
                    );
                }
                map.entry(token_id.to_string())
                    .or_insert_with(|| PromptLogprob {
                        logprob: e.logprob,
                        rank: None,
                        decoded_token: Some(token_text(tokenizer, token_id)),
                    });
                map
            })
        })
        .collect()
}

/// Chat logprobs (`logprobs.content`).
pub(crate) fn chat_logprobs(
    names: TokenNames<'_>,
    logprobs: &[TokenLogprob],
    top_logprobs: usize,
) -> ChatLogprobs {
    let content = logprobs
        .iter()
        .map(|entry| ChatLogprobToken {
            token: names.name(entry.token_id),
            logprob: entry.logprob,
            bytes: token_bytes(names.tokenizer, entry.token_id),
            top_logprobs: entry
                .top
                .iter()
                .take(top_logprobs)
                .map(|(id, lp)| ChatTopLogprob {
                    token: names.name(*id),
                    logprob: *lp,
                    bytes: token_bytes(names.tokenizer, *id),
                })
                .collect(),
        })
        .collect();
    ChatLogprobs {
        content: Some(content),
    }
}
