//! The OpenAPI document stays in step with the wire types: every field a request type has is
//! documented, every documented field exists, and every `$ref` resolves.

// Test helpers outside #[test] fns: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;

use serde_json::{json, Value};
use tokenmill_protocol::*;

fn schema_properties(document: &Value, schema: &str) -> BTreeSet<String> {
    document["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {schema} has no properties"))
        .keys()
        .cloned()
        .collect()
}

fn serialized_keys<T: serde::Serialize>(value: &T) -> BTreeSet<String> {
    serde_json::to_value(value)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// A request with every field set. A struct literal without `..Default::default()`: adding a
/// field to the type without listing it here (and in the schema) fails to compile.
fn full_completion_request() -> CompletionRequest {
    CompletionRequest {
        model: Some("m".into()),
        prompt: Some(PromptInput::Text("p".into())),
        suffix: Some(String::new()),
        max_tokens: Some(1),
        temperature: Some(1.0),
        top_p: Some(1.0),
        n: Some(1),
        stream: Some(true),
        stream_options: Some(StreamOptions::default()),
        logprobs: Some(1),
        echo: Some(true),
        stop: Some(StopInput::Single("s".into())),
        presence_penalty: Some(0.0),
        frequency_penalty: Some(0.0),
        best_of: Some(1),
        logit_bias: Some(Default::default()),
        seed: Some(1),
        user: Some("u".into()),
        top_k: Some(1),
        min_p: Some(0.0),
        repetition_penalty: Some(1.0),
        length_penalty: Some(1.0),
        use_beam_search: Some(false),
        stop_token_ids: Some(vec![]),
        include_stop_str_in_output: Some(false),
        ignore_eos: Some(false),
        min_tokens: Some(0),
        skip_special_tokens: Some(true),
        spaces_between_special_tokens: Some(true),
        truncate_prompt_tokens: Some(1),
        prompt_logprobs: Some(0),
        allowed_token_ids: Some(vec![]),
        bad_words: Some(vec![]),
        thinking_token_budget: Some(0),
        add_special_tokens: Some(true),
        priority: Some(0),
        request_id: Some("r".into()),
        return_token_ids: Some(true),
        cache_salt: Some("c".into()),
        response_format: Some(text_format()),
        guided: full_guided(),
    }
}

fn text_format() -> ResponseFormat {
    ResponseFormat {
        format_type: "text".into(),
        json_schema: None,
    }
}

/// Every structured-output field set (the values need not be a valid constraint).
fn full_guided() -> GuidedDecodingParams {
    GuidedDecodingParams {
        structured_outputs: Some(StructuredOutputsParams::default()),
        guided_json: Some(json!({})),
        guided_regex: Some("a".into()),
        guided_choice: Some(vec![]),
        guided_grammar: Some("g".into()),
        guided_whitespace_pattern: Some(" ".into()),
        guided_decoding_backend: Some("auto".into()),
    }
}

fn full_chat_request() -> ChatCompletionRequest {
    ChatCompletionRequest {
        model: Some("m".into()),
        messages: vec![ChatMessage::text(Role::User, "x")],
        max_tokens: Some(1),
        max_completion_tokens: Some(1),
        temperature: Some(1.0),
        top_p: Some(1.0),
        n: Some(1),
        stream: Some(true),
        stream_options: Some(StreamOptions::default()),
        logprobs: Some(true),
        top_logprobs: Some(1),
        stop: Some(StopInput::Many(vec![])),
        seed: Some(1),
        presence_penalty: Some(0.0),
        frequency_penalty: Some(0.0),
        logit_bias: Some(Default::default()),
        user: Some("u".into()),
        tools: Some(vec![]),
        tool_choice: Some(json!("none")),
        parallel_tool_calls: Some(true),
        include_reasoning: Some(true),
        response_format: Some(text_format()),
        guided: full_guided(),
        top_k: Some(1),
        min_p: Some(0.0),
        repetition_penalty: Some(1.0),
        length_penalty: Some(1.0),
        use_beam_search: Some(false),
        ignore_eos: Some(false),
        min_tokens: Some(0),
        stop_token_ids: Some(vec![]),
        skip_special_tokens: Some(true),
        spaces_between_special_tokens: Some(true),
        include_stop_str_in_output: Some(false),
        truncate_prompt_tokens: Some(1),
        prompt_logprobs: Some(0),
        allowed_token_ids: Some(vec![]),
        bad_words: Some(vec![]),
        thinking_token_budget: Some(0),
        add_generation_prompt: Some(true),
        continue_final_message: Some(false),
        add_special_tokens: Some(false),
        chat_template: Some("t".into()),
        chat_template_kwargs: Some(Default::default()),
        reasoning_effort: Some("low".into()),
        documents: Some(vec![]),
        priority: Some(0),
        request_id: Some("r".into()),
        return_token_ids: Some(true),
        cache_salt: Some("c".into()),
        echo: Some(false),
    }
}

#[test]
fn request_schemas_match_the_request_types() {
    let document = openapi_json();
    assert_eq!(
        schema_properties(&document, "CompletionRequest"),
        serialized_keys(&full_completion_request())
    );
    assert_eq!(
        schema_properties(&document, "ChatCompletionRequest"),
        serialized_keys(&full_chat_request())
    );
}

#[test]
fn response_schemas_cover_the_response_fields() {
    let document = openapi_json();
    let usage = Usage::new(1, 1, Some(1));
    assert_eq!(
        schema_properties(&document, "Usage"),
        serialized_keys(&usage)
    );
    let card = ModelCard::new("m".into(), 0, "r".into(), 1).with_architecture("llama");
    assert_eq!(
        schema_properties(&document, "ModelCard"),
        serialized_keys(&card)
    );
    let tokenize = TokenizeResponse {
        count: 0,
        max_model_len: 1,
        tokens: vec![],
        token_strs: Some(vec![]),
    };
    assert_eq!(
        schema_properties(&document, "TokenizeResponse"),
        serialized_keys(&tokenize)
    );
    let error = ErrorResponse::invalid_request("x");
    assert_eq!(
        schema_properties(&document, "ErrorResponse"),
        serialized_keys(&error)
    );
    let chat = ChatCompletionResponse::new("i".into(), 0, "m".into(), vec![], usage);
    let chat_keys = serialized_keys(&chat);
    assert!(chat_keys.is_subset(&schema_properties(&document, "ChatCompletionResponse")));
}

fn choice_properties(document: &Value, schema: &str) -> BTreeSet<String> {
    document["components"]["schemas"][schema]["properties"]["choices"]["items"]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {schema} has no choice properties"))
        .keys()
        .cloned()
        .collect()
}

#[test]
fn choice_schemas_match_fully_populated_choices() {
    let document = openapi_json();
    let completion_choice = CompletionChoice {
        index: 0,
        text: String::new(),
        logprobs: Some(CompletionLogprobs::default()),
        finish_reason: Some(FinishReason::Stop),
        stop_reason: Some(StopReason::TokenId(1)),
        token_ids: Some(vec![]),
        prompt_token_ids: Some(vec![]),
        prompt_logprobs: Some(vec![]),
    };
    assert_eq!(
        choice_properties(&document, "CompletionResponse"),
        serialized_keys(&completion_choice)
    );
    let chat_choice = ChatChoice {
        index: 0,
        message: ChatResponseMessage {
            role: "assistant".into(),
            content: Some(String::new()),
            reasoning: Some(String::new()),
            reasoning_content: Some(String::new()),
            tool_calls: Vec::new(),
        },
        logprobs: Some(ChatLogprobs::default()),
        finish_reason: None,
        stop_reason: None,
        token_ids: Some(vec![]),
    };
    assert_eq!(
        choice_properties(&document, "ChatCompletionResponse"),
        serialized_keys(&chat_choice)
    );
    let chunk_choice = ChatChunkChoice {
        index: 0,
        delta: ChatDelta::default(),
        logprobs: None,
        finish_reason: None,
        stop_reason: None,
        token_ids: Some(vec![]),
    };
    assert_eq!(
        choice_properties(&document, "ChatCompletionChunk"),
        serialized_keys(&chunk_choice)
    );
}

fn collect_refs(value: &Value, refs: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                refs.push(reference.clone());
            }
            map.values().for_each(|child| collect_refs(child, refs));
        }
        Value::Array(items) => items.iter().for_each(|child| collect_refs(child, refs)),
        _ => {}
    }
}

#[test]
fn every_ref_resolves_and_every_route_is_documented() {
    let document = openapi_json();
    assert_eq!(document["openapi"], "3.1.0");
    let mut refs = Vec::new();
    collect_refs(&document, &mut refs);
    assert!(!refs.is_empty());
    for reference in refs {
        let pointer = reference.trim_start_matches('#');
        assert!(
            document.pointer(pointer).is_some(),
            "dangling $ref {reference}"
        );
    }
    for (path, method) in [
        ("/v1/completions", "post"),
        ("/v1/chat/completions", "post"),
        ("/v1/models", "get"),
        ("/tokenize", "post"),
        ("/detokenize", "post"),
        ("/health", "get"),
        ("/version", "get"),
        ("/openapi.json", "get"),
        ("/v1/embeddings", "post"),
        ("/pooling", "post"),
        ("/score", "post"),
        ("/rerank", "post"),
        ("/v1/rerank", "post"),
        ("/v2/rerank", "post"),
        ("/classify", "post"),
        ("/v1/messages", "post"),
        ("/v1/messages/count_tokens", "post"),
        ("/v1/responses", "post"),
        ("/v1/responses/{id}", "get"),
        ("/v1/responses/{id}", "delete"),
        ("/v1/responses/{id}/input_items", "get"),
        ("/v1/responses/{id}/cancel", "post"),
    ] {
        assert!(
            document["paths"][path][method]["responses"]["200"].is_object(),
            "{method} {path}"
        );
    }
}

#[test]
fn request_schemas_carry_the_constraints_the_server_enforces() {
    let schemas = |document: &Value| document["components"]["schemas"].clone();
    let static_schemas = schemas(&openapi_json());
    // Token ids are u32s without a model, and the served vocabulary with one.
    assert_eq!(static_schemas["TokenId"]["maximum"], json!(u32::MAX));
    assert_eq!(
        static_schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["$ref"],
        "#/components/schemas/TokenId"
    );
    let completion = &static_schemas["CompletionRequest"]["properties"];
    assert_eq!(completion["temperature"]["anyOf"][0]["maximum"], 2.0);
    assert_eq!(completion["temperature"]["anyOf"][0]["minimum"], 0.0);
    assert_eq!(completion["top_p"]["anyOf"][0]["exclusiveMinimum"], 0);
    assert_eq!(completion["n"]["anyOf"][0]["minimum"], 1);
    assert_eq!(completion["allowed_token_ids"]["anyOf"][0]["minItems"], 1);
    assert_eq!(completion["prompt"]["anyOf"][0]["minLength"], 1);
    // A tool message needs content and the id of the call it answers.
    let message_rules = static_schemas["ChatMessage"]["anyOf"].as_array().unwrap();
    let tool_rule = message_rules
        .iter()
        .find(|rule| rule["properties"]["role"]["const"] == "tool")
        .unwrap();
    assert_eq!(tool_rule["required"], json!(["content", "tool_call_id"]));

    let mut limits = ValidationLimits::new(512, 49152);
    limits.max_n = 4;
    let mut served = openapi_json();
    apply_openapi_limits(&mut served, &limits);
    let served = schemas(&served);
    assert_eq!(served["TokenId"]["maximum"], 49151);
    for request in ["CompletionRequest", "ChatCompletionRequest"] {
        let properties = &served[request]["properties"];
        assert_eq!(properties["n"]["anyOf"][0]["maximum"], 4, "{request}");
        assert_eq!(
            properties["max_tokens"]["anyOf"][0]["maximum"], 512,
            "{request}"
        );
        assert_eq!(
            properties["top_k"]["anyOf"][0]["maximum"], 49152,
            "{request}"
        );
        assert_eq!(
            properties["prompt_logprobs"]["anyOf"][0]["maximum"], DEFAULT_MAX_LOGPROBS,
            "{request}"
        );
    }
    assert_eq!(
        served["ChatCompletionRequest"]["properties"]["max_completion_tokens"]["anyOf"][0]
            ["maximum"],
        512
    );
}

#[test]
fn streams_are_described_as_server_sent_events_of_chunks() {
    let document = openapi_json();
    for (path, chunk) in [
        ("/v1/completions", "CompletionStreamChunk"),
        ("/v1/chat/completions", "ChatCompletionChunk"),
    ] {
        let stream =
            &document["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"];
        assert!(
            stream["schema"].get("type").is_none(),
            "{path}: not a JSON string"
        );
        assert_eq!(
            stream["itemSchema"]["properties"]["data"]["oneOf"][0]["contentSchema"]["$ref"],
            format!("#/components/schemas/{chunk}")
        );
    }
}

#[test]
fn the_messages_api_is_documented_as_strictly_as_it_parses() {
    let document = openapi_json();
    let schemas = &document["components"]["schemas"];
    let request = &schemas["MessagesRequest"];
    assert_eq!(request["additionalProperties"], false);
    assert_eq!(
        request["required"],
        json!(["model", "max_tokens", "messages"])
    );
    // Every documented property is one the request type reads (a request naming all of them
    // with null or a valid value parses), and the type reads no other (deny_unknown_fields).
    let mut full = serde_json::Map::new();
    for name in request["properties"].as_object().unwrap().keys() {
        full.insert(name.clone(), Value::Null);
    }
    full.insert("model".into(), json!("m"));
    full.insert("max_tokens".into(), json!(5));
    full.insert(
        "messages".into(),
        json!([{"role": "user", "content": "hi"}]),
    );
    tokenmill_protocol::parse_anthropic::<tokenmill_protocol::MessagesRequest>(
        Value::Object(full).to_string().as_bytes(),
    )
    .unwrap();
    let errors = &document["paths"]["/v1/messages"]["post"]["responses"];
    assert_eq!(
        errors["529"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/AnthropicError"
    );
    let mut served = openapi_json();
    apply_openapi_limits(&mut served, &ValidationLimits::new(512, 100));
    assert_eq!(
        served["components"]["schemas"]["MessagesRequest"]["properties"]["max_tokens"]["maximum"],
        511
    );
}

#[test]
fn the_responses_request_schema_lists_every_field_and_refuses_others() {
    let document = openapi_json();
    // Every field of the request serializes (as null when unset).
    let fields = serialized_keys(&tokenmill_protocol::ResponsesRequest::default());
    assert_eq!(schema_properties(&document, "ResponsesRequest"), fields);
    assert_eq!(
        document["components"]["schemas"]["ResponsesRequest"]["additionalProperties"],
        false
    );
}
