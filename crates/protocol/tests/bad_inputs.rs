//! The bad-input battery: each malformed or out-of-range request is rejected with a 400 that
//! names the right `param` and explains the problem. Table-driven so a case is one line.

// Test helpers outside #[test] fns: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};
use tokenmill_protocol::{
    parse_json, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ErrorResponse,
    ProtocolError, TokenizeRequest, ToolSettings, ValidationLimits,
};

const VOCAB_SIZE: u32 = 1000;
const MAX_MODEL_LEN: u32 = 512;

fn limits() -> ValidationLimits {
    let mut limits = ValidationLimits::new(MAX_MODEL_LEN, VOCAB_SIZE);
    limits.max_n = 8;
    limits
}

#[derive(Clone, Copy, Debug)]
enum Endpoint {
    Completion,
    Chat,
    Tokenize,
    Detokenize,
}

/// Runs the whole request path this crate owns: parse, validate parameters, check prompt or
/// messages (and template options). Returns the first error.
fn check(endpoint: Endpoint, body: &[u8]) -> Result<(), ProtocolError> {
    let limits = limits();
    match endpoint {
        Endpoint::Completion => {
            let request: CompletionRequest = parse_json(body)?;
            request.validate(&limits)?;
            request.prompts(&limits)?;
        }
        Endpoint::Chat => {
            let request: ChatCompletionRequest = parse_json(body)?;
            request.validate(&limits)?;
            request.conversation()?;
            request.template_options()?;
            request.tool_plan(&ToolSettings::default(), true)?;
        }
        Endpoint::Tokenize => {
            let request: TokenizeRequest = parse_json(body)?;
            request.input()?;
        }
        Endpoint::Detokenize => {
            let request: DetokenizeRequest = parse_json(body)?;
            request.validate(&limits)?;
        }
    }
    Ok(())
}

fn completion(extra: Value) -> Vec<u8> {
    let mut body = json!({"model": "m", "prompt": "Hello"});
    merge(&mut body, extra);
    serde_json::to_vec(&body).unwrap()
}

fn chat(extra: Value) -> Vec<u8> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]});
    merge(&mut body, extra);
    serde_json::to_vec(&body).unwrap()
}

fn merge(body: &mut Value, extra: Value) {
    if let (Value::Object(body), Value::Object(extra)) = (body, extra) {
        body.extend(extra);
    }
}

/// (name, endpoint, body, expected param (None: malformed JSON), message fragment)
type Case = (
    &'static str,
    Endpoint,
    Vec<u8>,
    Option<&'static str>,
    &'static str,
);

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    use Endpoint::*;
    vec![
        // Malformed bodies and wrong JSON types: 400 without a param.
        ("not json", Completion, b"{\"prompt\": ".to_vec(), None, "Invalid request body"),
        ("array body", Completion, b"[1, 2]".to_vec(), None, "Invalid request body"),
        ("string temperature", Completion, completion(json!({"temperature": "hot"})), None, "invalid type"),
        ("fractional max_tokens", Completion, completion(json!({"max_tokens": 1.5})), None, "invalid type"),
        ("prompt is a number", Completion, completion(json!({"prompt": 42})), None, "`prompt` must be"),
        ("negative prompt token", Completion, completion(json!({"prompt": [1, -2]})), None, "`prompt` must be"),
        ("mixed prompt list", Completion, completion(json!({"prompt": ["a", 1]})), None, "`prompt` must be"),
        ("stop is a number", Chat, chat(json!({"stop": 5})), None, "`stop` must be"),
        ("unknown role", Chat, chat(json!({"messages": [{"role": "robot", "content": "x"}]})), None, "unknown variant"),
        ("content is a number", Chat, chat(json!({"messages": [{"role": "user", "content": 7}]})), None, "content"),
        ("messages missing", Chat, b"{\"model\": \"m\"}".to_vec(), None, "missing field `messages`"),
        ("tokenize without input", Tokenize, b"{\"model\": \"m\"}".to_vec(), None, "`prompt` or `messages`"),
        // Completion-specific parameters.
        ("missing prompt", Completion, b"{\"model\": \"m\"}".to_vec(), Some("prompt"), "prompt is required"),
        ("empty prompt", Completion, completion(json!({"prompt": ""})), Some("prompt"), "must not be empty"),
        ("empty prompt list", Completion, completion(json!({"prompt": []})), Some("prompt"), "empty list"),
        ("empty token list", Completion, completion(json!({"prompt": [[]]})), Some("prompt"), "must not be empty"),
        ("prompt token out of vocab", Completion, completion(json!({"prompt": [1, 1000]})), Some("prompt"), "out of vocabulary"),
        ("suffix", Completion, completion(json!({"suffix": "end"})), Some("suffix"), "not supported"),
        ("max_tokens zero", Completion, completion(json!({"max_tokens": 0})), Some("max_tokens"), "at least 1"),
        ("max_tokens negative", Completion, completion(json!({"max_tokens": -5})), Some("max_tokens"), "at least 1"),
        ("max_tokens over context", Completion, completion(json!({"max_tokens": 513})), Some("max_tokens"), "maximum context length"),
        ("logprobs over 20", Completion, completion(json!({"logprobs": 21})), Some("logprobs"), "between 0 and 20"),
        ("logprobs negative", Completion, completion(json!({"logprobs": -2})), Some("logprobs"), "between 0 and 20"),
        ("best_of below n", Completion, completion(json!({"n": 3, "best_of": 2})), Some("best_of"), "greater than or equal to n"),
        ("best_of above n", Completion, completion(json!({"n": 1, "best_of": 3})), Some("best_of"), "best_of must equal n"),
        // Sampling parameters, shared by both endpoints.
        ("temperature negative", Completion, completion(json!({"temperature": -0.1})), Some("temperature"), "non-negative"),
        ("temperature above 2", Chat, chat(json!({"temperature": 2.5})), Some("temperature"), "[0, 2]"),
        ("top_p zero", Completion, completion(json!({"top_p": 0})), Some("top_p"), "(0, 1]"),
        ("top_p above 1", Chat, chat(json!({"top_p": 1.01})), Some("top_p"), "(0, 1]"),
        ("top_k below -1", Completion, completion(json!({"top_k": -2})), Some("top_k"), "at least 1"),
        ("top_k over vocab", Chat, chat(json!({"top_k": 1001})), Some("top_k"), "vocabulary size"),
        ("min_p above 1", Completion, completion(json!({"min_p": 1.5})), Some("min_p"), "[0, 1]"),
        ("presence_penalty", Chat, chat(json!({"presence_penalty": 2.1})), Some("presence_penalty"), "[-2, 2]"),
        ("frequency_penalty", Completion, completion(json!({"frequency_penalty": -3})), Some("frequency_penalty"), "[-2, 2]"),
        ("repetition_penalty zero", Chat, chat(json!({"repetition_penalty": 0})), Some("repetition_penalty"), "greater than zero"),
        // Found by schemathesis: positive f64s that are 0 or infinite as the sampler's f32.
        ("repetition_penalty below f32", Chat, chat(json!({"repetition_penalty": 5e-324})), Some("repetition_penalty"), "greater than zero"),
        ("repetition_penalty above f32", Completion, completion(json!({"repetition_penalty": 1e300})), Some("repetition_penalty"), "at most"),
        ("tokenize with a null tool", Tokenize, br#"{"messages": [{"role": "user", "content": "x"}], "tools": [null]}"#.to_vec(), Some("tools"), "not a function tool"),
        ("tool_calls item not an object", Chat, chat(json!({"messages": [{"role": "assistant", "content": "x", "tool_calls": [[1]]}]})), Some("messages"), "must be an object"),
        ("n zero", Completion, completion(json!({"n": 0})), Some("n"), "at least 1"),
        ("n over max", Chat, chat(json!({"n": 9})), Some("n"), "at most 8"),
        ("greedy with n > 1", Chat, chat(json!({"n": 2, "temperature": 0})), Some("n"), "greedy"),
        ("min_tokens negative", Completion, completion(json!({"min_tokens": -1})), Some("min_tokens"), "greater than or equal to 0"),
        ("min_tokens over max_tokens", Completion, completion(json!({"max_tokens": 4, "min_tokens": 5})), Some("min_tokens"), "less than or equal to"),
        ("seed too large", Completion, br#"{"prompt": "x", "seed": 36893488147419103232}"#.to_vec(), Some("seed"), "64-bit"),
        ("empty stop string", Chat, chat(json!({"stop": ["ok", ""]})), Some("stop"), "empty string"),
        ("stop token out of vocab", Completion, completion(json!({"stop_token_ids": [5000]})), Some("stop_token_ids"), "out of vocabulary"),
        ("logit_bias key not a token", Chat, chat(json!({"logit_bias": {"hello": 1}})), Some("logit_bias"), "not a token id"),
        ("logit_bias out of vocab", Completion, completion(json!({"logit_bias": {"99999": 1}})), Some("logit_bias"), "out of vocabulary"),
        ("logit_bias value range", Chat, chat(json!({"logit_bias": {"5": 101}})), Some("logit_bias"), "[-100, 100]"),
        ("allowed_token_ids empty", Completion, completion(json!({"allowed_token_ids": []})), Some("allowed_token_ids"), "must not be empty"),
        ("bad_words empty", Chat, chat(json!({"bad_words": [" "]})), Some("bad_words"), "empty string"),
        ("prompt_logprobs with stream", Completion, completion(json!({"prompt_logprobs": 1, "stream": true})), Some("prompt_logprobs"), "stream"),
        ("stream_options without stream", Chat, chat(json!({"stream_options": {"include_usage": true}})), Some("stream_options"), "stream is true"),
        ("truncate_prompt_tokens zero", Completion, completion(json!({"truncate_prompt_tokens": 0})), Some("truncate_prompt_tokens"), "-1 or at least 1"),
        ("truncate over context", Chat, chat(json!({"truncate_prompt_tokens": 1000})), Some("truncate_prompt_tokens"), "max_model_len"),
        ("empty cache_salt", Completion, completion(json!({"cache_salt": ""})), Some("cache_salt"), "1 to 1024"),
        ("cache_salt over 1024 characters", Chat, chat(json!({"cache_salt": "é".repeat(1025)})), Some("cache_salt"), "1 to 1024 characters"),
        ("empty request_id", Chat, chat(json!({"request_id": ""})), Some("request_id"), "must not be empty"),
        ("beam search", Completion, completion(json!({"use_beam_search": true})), Some("use_beam_search"), "not supported"),
        ("response_format unknown", Chat, chat(json!({"response_format": {"type": "yaml"}})), Some("response_format"), "json_schema"),
        ("json_schema without body", Completion, completion(json!({"response_format": {"type": "json_schema"}})), Some("response_format"), "must be provided"),
        // Chat-specific parameters.
        ("empty messages", Chat, chat(json!({"messages": []})), Some("messages"), "must not be empty"),
        ("image part", Chat, chat(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})), Some("messages"), "\"image_url\" is not supported"),
        ("text part without text", Chat, chat(json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]})), Some("messages"), "needs a `text` field"),
        ("user message without content", Chat, chat(json!({"messages": [{"role": "user"}]})), Some("messages"), "has no content"),
        ("tool message without id", Chat, chat(json!({"messages": [{"role": "tool", "content": "42"}]})), Some("messages"), "tool_call_id"),
        ("top_logprobs without logprobs", Chat, chat(json!({"top_logprobs": 2})), Some("top_logprobs"), "must be set to true"),
        ("top_logprobs over 20", Chat, chat(json!({"logprobs": true, "top_logprobs": 21})), Some("top_logprobs"), "between 0 and 20"),
        ("max_completion_tokens zero", Chat, chat(json!({"max_completion_tokens": 0})), Some("max_completion_tokens"), "at least 1"),
        ("tool_choice required without tools", Chat, chat(json!({"tools": [], "tool_choice": "required"})), Some("tool_choice"), "`tools` must be set"),
        ("tool_choice auto without the server flags", Chat, chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})), Some("tool_choice"), "requires --enable-auto-tool-choice and --tool-call-parser"),
        ("tool_choice names an unknown function", Chat, chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})), Some("tool_choice"), "has not been passed"),
        ("tools with a non-function tool", Chat, chat(json!({"tools": [{"type": "code_interpreter"}], "tool_choice": "none"})), Some("tools"), "function"),
        ("continue and generation prompt", Chat, chat(json!({"messages": [{"role": "assistant", "content": "Hi"}], "continue_final_message": true, "add_generation_prompt": true})), Some("continue_final_message"), "Cannot set both"),
        ("continue a user message", Chat, chat(json!({"continue_final_message": true})), Some("continue_final_message"), "assistant"),
        ("tokenize empty messages", Tokenize, b"{\"messages\": []}".to_vec(), Some("messages"), "must not be empty"),
        ("detokenize out of vocab", Detokenize, b"{\"tokens\": [1, 1000]}".to_vec(), Some("tokens"), "out of vocabulary"),
    ]
}

#[test]
fn every_bad_input_is_a_400_with_the_right_param() {
    let cases = cases();
    assert!(
        cases.len() >= 30,
        "the battery must stay at 30 cases or more"
    );
    let mut failures = Vec::new();
    for (name, endpoint, body, param, fragment) in cases {
        let error = match check(endpoint, &body) {
            Ok(()) => {
                failures.push(format!(
                    "{name}: accepted {}",
                    String::from_utf8_lossy(&body)
                ));
                continue;
            }
            Err(error) => error,
        };
        let response = ErrorResponse::from(&error);
        if response.status() != 400 {
            failures.push(format!("{name}: status {}", response.status()));
        }
        if response.error.param.as_deref() != param {
            failures.push(format!(
                "{name}: param {:?}, expected {param:?}",
                response.error.param
            ));
        }
        if !response.error.message.contains(fragment) {
            failures.push(format!(
                "{name}: message {:?} lacks {fragment:?}",
                response.error.message
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The edges of each range are accepted: a battery that rejected everything would pass above.
#[test]
fn boundary_values_are_accepted() {
    let accepted = [
        (
            Endpoint::Completion,
            completion(
                json!({"temperature": 2, "top_p": 1, "top_k": -1, "min_p": 1,
            "presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 0.01, "n": 8,
            "logprobs": 20, "max_tokens": 512, "min_tokens": 512, "seed": -9223372036854775808i64,
            "logit_bias": {"0": -100, "999": 100}, "stop": [], "truncate_prompt_tokens": -1}),
            ),
        ),
        (
            Endpoint::Completion,
            completion(json!({"prompt": [[0, 999]], "best_of": 1, "top_k": 0,
            "seed": 18446744073709551615u64, "echo": true, "max_tokens": 0})),
        ),
        (
            Endpoint::Chat,
            chat(json!({"logprobs": true, "top_logprobs": 20, "top_k": 1000,
            "stream": true, "stream_options": {"include_usage": true}, "tool_choice": "auto",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}})),
        ),
        (
            Endpoint::Chat,
            chat(json!({"messages": [{"role": "developer", "content": "d"},
            {"role": "assistant", "content": [{"type": "text", "text": "partial"}]}],
            "continue_final_message": true})),
        ),
        (
            Endpoint::Chat,
            chat(json!({"max_tokens": 8.0, "n": 2.0, "top_k": -1.0})),
        ),
        // 1024 two-byte characters: the limit counts characters, as the schema's maxLength.
        (
            Endpoint::Chat,
            chat(json!({"cache_salt": "é".repeat(1024)})),
        ),
        (Endpoint::Tokenize, b"{\"prompt\": \"\"}".to_vec()),
        (Endpoint::Detokenize, b"{\"tokens\": [0, 999]}".to_vec()),
    ];
    for (endpoint, body) in accepted {
        if let Err(error) = check(endpoint, &body) {
            panic!(
                "{endpoint:?} rejected {}: {error}",
                String::from_utf8_lossy(&body)
            );
        }
    }
}

#[test]
fn prompt_plus_max_tokens_over_context_names_max_tokens() {
    let limits = limits();
    let request: CompletionRequest = parse_json(&completion(json!({"max_tokens": 100}))).unwrap();
    let validated = request.validate(&limits).unwrap();
    assert_eq!(validated.resolve_max_tokens(412, &limits).unwrap(), 100);
    let error = validated.resolve_max_tokens(413, &limits).unwrap_err();
    assert_eq!(error.param(), Some("max_tokens"));
    assert!(
        error.message().contains("maximum context length is 512"),
        "{}",
        error.message()
    );

    let chat_request: ChatCompletionRequest = parse_json(&chat(json!({}))).unwrap();
    let validated = chat_request.validate(&limits).unwrap();
    let error = validated.resolve_max_tokens(600, &limits).unwrap_err();
    assert_eq!(error.param(), Some("messages"));
}

/// Found by schemathesis: a positive `top_p` below f32's range (5e-324) is accepted and keeps
/// only the most likely token; it used to reach the sampler as 0 and fail the request there.
#[test]
fn a_top_p_below_f32_range_stays_positive() {
    let request: CompletionRequest =
        parse_json(&completion(json!({"top_p": 5e-324, "temperature": 1}))).unwrap();
    let validated = request.validate(&limits()).unwrap();
    assert!(validated.sampling.top_p > 0.0);
    assert!(validated.sampling.top_p < 1e-30);
}
