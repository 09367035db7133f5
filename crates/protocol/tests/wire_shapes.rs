//! Golden wire shapes: requests as real clients send them (openai-python, GuideLLM, lm-eval,
//! `vllm bench serve`) parse and validate as intended, and responses serialize to exactly the
//! JSON OpenAI and vLLM clients read, and parse back.

// Test helpers outside #[test] fns: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};
use tokenmill_protocol::*;

fn limits() -> ValidationLimits {
    ValidationLimits::new(2048, 49152)
}

fn round_trip<T>(value: &T, expected: Value)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_value(value).unwrap();
    assert_eq!(
        json, expected,
        "serialized form differs from the golden JSON"
    );
    let back: T = serde_json::from_value(json).unwrap();
    assert_eq!(
        &back, value,
        "parsing the golden JSON back changed the value"
    );
}

#[test]
fn lm_eval_loglikelihood_request_scores_the_prompt() {
    // lm-eval `local-completions` loglikelihood: token-id batches, echo, one token, greedy.
    let body = br#"{"model": "smollm2", "prompt": [[504, 3458, 314], [504, 3458, 6420]],
        "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": true}"#;
    let request: CompletionRequest = parse_json(body).unwrap();
    let validated = request.validate(&limits()).unwrap();
    assert!(validated.sampling.is_greedy());
    assert_eq!(validated.sampling.max_tokens, Some(1));
    assert_eq!(validated.sampling.logprobs, Some(1));
    assert_eq!(
        validated.sampling.prompt_logprobs,
        Some(1),
        "echo + logprobs scores the prompt"
    );
    assert_eq!(validated.sampling.seed, Some(1234));
    assert!(validated.output.echo && !validated.output.echo_without_generation);
    let prompts = request.prompts(&limits()).unwrap();
    assert_eq!(
        prompts,
        vec![
            Prompt::Tokens(vec![504, 3458, 314]),
            Prompt::Tokens(vec![504, 3458, 6420])
        ]
    );
}

#[test]
fn guidellm_chat_request_with_text_parts() {
    let body = br#"{"model": "smollm2", "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}],
        "max_tokens": 128, "max_completion_tokens": 128, "stop": null, "ignore_eos": true}"#;
    let request: ChatCompletionRequest = parse_json(body).unwrap();
    let validated = request.validate(&limits()).unwrap();
    assert!(validated.output.stream && validated.output.include_usage);
    assert!(validated.output.continuous_usage_stats);
    assert!(validated.sampling.ignore_eos);
    assert_eq!(validated.sampling.max_tokens, Some(128));
    let conversation = request.conversation().unwrap();
    assert_eq!(conversation[0].content.as_deref(), Some("Tell me a story"));
    let template = request.template_options().unwrap();
    assert!(template.add_generation_prompt && !template.continue_final_message);
}

#[test]
fn vllm_bench_serve_completion_request() {
    let body = br#"{"model": "smollm2", "prompt": "lorem ipsum", "temperature": 0.0,
        "repetition_penalty": 1.0, "max_tokens": 128, "logprobs": null, "stream": true,
        "stream_options": {"include_usage": true}, "ignore_eos": true}"#;
    let request: CompletionRequest = parse_json(body).unwrap();
    let validated = request.validate(&limits()).unwrap();
    assert_eq!(validated.sampling.logprobs, None);
    assert!(validated.output.include_usage && !validated.output.continuous_usage_stats);
    assert_eq!(validated.output.prompt_param, "prompt");
}

#[test]
fn openai_python_chat_request_with_extra_body() {
    // openai-python sends `extra_body` keys at the top level next to the OpenAI ones.
    let body = br#"{"messages": [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi", "name": "alice"}],
        "model": "smollm2", "n": 2, "seed": 7, "logprobs": true, "top_logprobs": 2,
        "stop": ["\n\n"], "user": "u-1", "top_k": 20, "min_p": 0.05,
        "chat_template_kwargs": {"enable_thinking": false}, "priority": -3,
        "request_id": "abc", "return_token_ids": true, "cache_salt": "salt"}"#;
    let request: ChatCompletionRequest = parse_json(body).unwrap();
    let validated = request.validate(&limits()).unwrap();
    let sampling = &validated.sampling;
    assert_eq!(
        (sampling.n, sampling.seed, sampling.logprobs),
        (2, Some(7), Some(2))
    );
    assert_eq!((sampling.top_k, sampling.min_p), (Some(20), 0.05));
    assert_eq!(sampling.stop, vec!["\n\n"]);
    assert_eq!(validated.output.priority, -3);
    assert_eq!(validated.output.request_id.as_deref(), Some("abc"));
    assert_eq!(validated.output.cache_salt.as_deref(), Some("salt"));
    assert!(validated.output.return_token_ids);
    assert_eq!(
        sampling.max_tokens, None,
        "chat without a limit runs to the end of the context"
    );
    let template = request.template_options().unwrap();
    assert_eq!(
        template.chat_template_kwargs["enable_thinking"],
        json!(false)
    );
    assert_eq!(
        request.conversation().unwrap()[1].name.as_deref(),
        Some("alice")
    );
}

#[test]
fn unknown_fields_and_explicit_nulls_are_ignored() {
    let body = br#"{"prompt": "x", "model": "m", "functions": [{"name": "f"}],
        "reasoning_effort": "low", "service_tier": "auto", "metadata": {"a": 1},
        "max_tokens": null, "temperature": null, "top_p": null, "n": null, "stream": null,
        "stream_options": null, "logprobs": null, "echo": null, "stop": null, "seed": null,
        "presence_penalty": null, "frequency_penalty": null, "best_of": null, "logit_bias": null,
        "user": null, "suffix": null, "top_k": null, "min_p": null, "repetition_penalty": null,
        "stop_token_ids": null, "skip_special_tokens": null, "response_format": null}"#;
    let request: CompletionRequest = parse_json(body).unwrap();
    let validated = request.validate(&limits()).unwrap();
    assert_eq!(validated.sampling, SamplingOptions::default());

    let chat: ChatCompletionRequest = parse_json(
        br#"{"messages": [{"role": "user", "content": "x", "refusal": null}], "parallel_tool_calls": true,
            "modalities": ["text"], "max_tokens": null, "tools": null, "tool_choice": null}"#,
    )
    .unwrap();
    chat.validate(&limits()).unwrap();
}

#[test]
fn request_round_trip_keeps_only_set_fields() {
    let request = CompletionRequest {
        model: Some("m".into()),
        prompt: Some(PromptInput::Texts(vec!["a".into(), "b".into()])),
        max_tokens: Some(3),
        stop: Some(StopInput::Single("\n".into())),
        ..CompletionRequest::default()
    };
    round_trip(
        &request,
        json!({"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "stop": "\n"}),
    );

    let chat = ChatCompletionRequest {
        messages: vec![ChatMessage::text(Role::User, "hi")],
        stream: Some(true),
        stream_options: Some(StreamOptions {
            include_usage: Some(true),
            continuous_usage_stats: None,
        }),
        ..ChatCompletionRequest::default()
    };
    round_trip(
        &chat,
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
               "stream_options": {"include_usage": true}}),
    );
}

#[test]
fn echo_completion_response_with_legacy_logprobs() {
    // What lm-eval reads: the prompt's tokens first (the first without a logprob), then the
    // generated token; text_offset counts characters.
    let logprobs = CompletionLogprobs {
        tokens: vec!["The".into(), " cat".into(), " sat".into()],
        token_logprobs: vec![None, Some(-2.5), Some(-0.75)],
        top_logprobs: vec![
            None,
            Some(TopLogprobMap(vec![(" dog".into(), -1.5)])),
            Some(TopLogprobMap(vec![(" sat".into(), -0.75)])),
        ],
        text_offset: vec![0, 3, 7],
    };
    let response = CompletionResponse::new(
        "cmpl-1".into(),
        1_700_000_000,
        "smollm2".into(),
        vec![CompletionChoice {
            index: 0,
            text: "The cat sat".into(),
            logprobs: Some(logprobs),
            finish_reason: Some(FinishReason::Length),
            stop_reason: None,
            token_ids: None,
            prompt_token_ids: None,
            prompt_logprobs: None,
        }],
        Usage::new(2, 1, Some(0)),
    );
    round_trip(
        &response,
        json!({
            "id": "cmpl-1", "object": "text_completion", "created": 1_700_000_000u64,
            "model": "smollm2",
            "choices": [{
                "index": 0, "text": "The cat sat",
                "logprobs": {
                    "tokens": ["The", " cat", " sat"],
                    "token_logprobs": [null, -2.5, -0.75],
                    "top_logprobs": [null, {" dog": -1.5}, {" sat": -0.75}],
                    "text_offset": [0, 3, 7]
                },
                "finish_reason": "length", "stop_reason": null
            }],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3,
                      "prompt_tokens_details": {"cached_tokens": 0}}
        }),
    );
}

#[test]
fn completion_stream_chunks() {
    let mut chunk = CompletionStreamChunk::new(
        "cmpl-2".into(),
        5,
        "m".into(),
        vec![CompletionStreamChoice {
            index: 1,
            text: " world".into(),
            logprobs: None,
            finish_reason: Some(FinishReason::Stop),
            stop_reason: Some(StopReason::Text("\n".into())),
            token_ids: Some(vec![1917]),
            prompt_token_ids: None,
        }],
    );
    round_trip(
        &chunk,
        json!({"id": "cmpl-2", "object": "text_completion", "created": 5, "model": "m",
               "choices": [{"index": 1, "text": " world", "logprobs": null,
                            "finish_reason": "stop", "stop_reason": "\n", "token_ids": [1917]}]}),
    );
    chunk.choices.clear();
    chunk.usage = Some(Usage::new(4, 6, None));
    round_trip(
        &chunk,
        json!({"id": "cmpl-2", "object": "text_completion", "created": 5, "model": "m", "choices": [],
               "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}}),
    );
}

#[test]
fn chat_response_with_logprobs() {
    let response = ChatCompletionResponse::new(
        "chatcmpl-3".into(),
        9,
        "m".into(),
        vec![ChatChoice {
            index: 0,
            message: ChatResponseMessage {
                role: "assistant".into(),
                content: Some("Hi".into()),
                reasoning: None,
                reasoning_content: None,
                tool_calls: Vec::new(),
            },
            logprobs: Some(ChatLogprobs {
                content: Some(vec![ChatLogprobToken {
                    token: "Hi".into(),
                    logprob: -0.5,
                    bytes: Some(vec![72, 105]),
                    top_logprobs: vec![ChatTopLogprob {
                        token: "Hello".into(),
                        logprob: -1.25,
                        bytes: Some(b"Hello".to_vec()),
                    }],
                }]),
            }),
            finish_reason: Some(FinishReason::Stop),
            stop_reason: Some(StopReason::TokenId(2)),
            token_ids: None,
        }],
        Usage::new(10, 1, None),
    );
    round_trip(
        &response,
        json!({
            "id": "chatcmpl-3", "object": "chat.completion", "created": 9, "model": "m",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                    "top_logprobs": [{"token": "Hello", "logprob": -1.25,
                                      "bytes": [72, 101, 108, 108, 111]}]}]},
                "finish_reason": "stop", "stop_reason": 2
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        }),
    );
}

#[test]
fn chat_stream_role_content_and_usage_chunks() {
    let delta_chunk = |delta: ChatDelta, finish_reason| {
        ChatCompletionChunk::new(
            "chatcmpl-4".into(),
            1,
            "m".into(),
            vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason,
                stop_reason: None,
                token_ids: None,
            }],
        )
    };
    let role = delta_chunk(
        ChatDelta {
            role: Some("assistant".into()),
            content: Some(String::new()),
            ..ChatDelta::default()
        },
        None,
    );
    round_trip(
        &role,
        json!({"id": "chatcmpl-4", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": null, "finish_reason": null, "stop_reason": null}]}),
    );
    let last = delta_chunk(
        ChatDelta {
            content: Some("!".into()),
            ..ChatDelta::default()
        },
        Some(FinishReason::Length),
    );
    round_trip(
        &last,
        json!({"id": "chatcmpl-4", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": "!"},
                            "logprobs": null, "finish_reason": "length", "stop_reason": null}]}),
    );
    let mut usage = ChatCompletionChunk::new("chatcmpl-4".into(), 1, "m".into(), Vec::new());
    usage.usage = Some(Usage::new(3, 2, Some(2)));
    round_trip(
        &usage,
        json!({"id": "chatcmpl-4", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                        "prompt_tokens_details": {"cached_tokens": 2}}}),
    );
}

#[test]
fn real_openai_responses_parse() {
    // Shapes copied from OpenAI's API reference: extra fields must not break parsing (the
    // bench client reads other servers' responses with these types).
    let chat: ChatCompletionResponse = serde_json::from_value(json!({
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", "object": "chat.completion",
        "created": 1741570283, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!",
            "refusal": null, "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1117, "completion_tokens": 46, "total_tokens": 1163,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0}},
        "service_tier": "default", "system_fingerprint": "fp_fc9f1d7035"
    }))
    .unwrap();
    assert_eq!(chat.choices[0].message.content.as_deref(), Some("Hello!"));
    assert_eq!(
        chat.usage
            .prompt_tokens_details
            .map(|details| details.cached_tokens),
        Some(0)
    );

    let chunk: ChatCompletionChunk = serde_json::from_value(json!({
        "id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
        "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                     "logprobs": null, "finish_reason": null}]
    }))
    .unwrap();
    assert_eq!(chunk.choices[0].delta.role, Some("assistant".to_string()));

    let completion: CompletionResponse = serde_json::from_value(json!({
        "id": "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7", "object": "text_completion", "created": 1589478378,
        "model": "gpt-3.5-turbo-instruct", "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"text": "\n\nThis is indeed a test", "index": 0, "logprobs": null,
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    }))
    .unwrap();
    assert_eq!(
        completion.choices[0].finish_reason,
        Some(FinishReason::Length)
    );
}

#[test]
fn models_tokenize_detokenize_and_error_shapes() {
    let models = ModelList::new(vec![ModelCard::new(
        "smollm2".into(),
        3,
        "/models/smollm2.gguf".into(),
        2048,
    )]);
    round_trip(
        &models,
        json!({"object": "list", "data": [{"id": "smollm2", "object": "model", "created": 3,
               "owned_by": "tokenmill", "root": "/models/smollm2.gguf", "parent": null,
               "max_model_len": 2048, "permission": []}]}),
    );

    let completion_form: TokenizeRequest =
        parse_json(br#"{"model": "m", "prompt": "hi"}"#).unwrap();
    assert_eq!(
        completion_form.input().unwrap(),
        TokenizeInput::Prompt {
            text: "hi".into(),
            add_special_tokens: true
        }
    );
    let chat_form: TokenizeRequest = parse_json(
        br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
             "add_generation_prompt": false, "return_token_strs": true}"#,
    )
    .unwrap();
    assert!(chat_form.return_token_strs());
    match chat_form.input().unwrap() {
        TokenizeInput::Chat {
            messages,
            template,
            add_special_tokens,
        } => {
            assert_eq!(messages[0].content.as_deref(), Some("hi"));
            assert!(!template.add_generation_prompt && !add_special_tokens);
        }
        other => panic!("expected the chat form, got {other:?}"),
    }
    round_trip(
        &TokenizeResponse {
            count: 2,
            max_model_len: 2048,
            tokens: vec![1, 2],
            token_strs: None,
        },
        json!({"count": 2, "max_model_len": 2048, "tokens": [1, 2]}),
    );
    round_trip(
        &DetokenizeRequest {
            model: None,
            tokens: vec![5, 6],
        },
        json!({"tokens": [5, 6]}),
    );
    round_trip(
        &DetokenizeResponse {
            prompt: "hi".into(),
        },
        json!({"prompt": "hi"}),
    );
    round_trip(
        &ErrorResponse::model_not_found("gpt-9"),
        json!({"error": {"message": "The model `gpt-9` does not exist.", "type": "not_found_error",
                         "param": "model", "code": 404}}),
    );
}
