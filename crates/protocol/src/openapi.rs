//! The OpenAPI 3.1 document served at `GET /openapi.json`, written by hand from the wire types
//! in this crate. Tests keep it honest: every request field the types accept is in the schema
//! and every schema property is a field the types accept.

use serde_json::{json, Map, Value};

use crate::{ValidationLimits, DEFAULT_MAX_PROMPTS};

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn integer(description: &str) -> Value {
    nullable(json!({"type": "integer", "description": description}))
}

fn number(description: &str) -> Value {
    nullable(json!({"type": "number", "description": description}))
}

fn boolean(description: &str) -> Value {
    nullable(json!({"type": "boolean", "description": description}))
}

fn string(description: &str) -> Value {
    nullable(json!({"type": "string", "description": description}))
}

/// An integer in `[minimum, maximum]` (either bound optional), or null.
fn bounded_integer(description: &str, minimum: Option<i128>, maximum: Option<i128>) -> Value {
    let mut schema = json!({"type": "integer", "description": description});
    if let Some(minimum) = minimum {
        schema["minimum"] = json!(minimum);
    }
    if let Some(maximum) = maximum {
        schema["maximum"] = json!(maximum);
    }
    nullable(schema)
}

/// A number in `[minimum, maximum]`, or null.
fn bounded_number(description: &str, minimum: f64, maximum: f64) -> Value {
    nullable(
        json!({"type": "number", "minimum": minimum, "maximum": maximum, "description": description}),
    )
}

/// A token id: the served model's vocabulary bounds it (the server fills in the maximum,
/// see [`apply_limits`]); statically, a `u32`.
fn token_id() -> Value {
    schema_ref("TokenId")
}

fn token_ids(description: &str) -> Value {
    nullable(json!({"type": "array", "items": token_id(), "description": description}))
}

fn object(properties: Vec<(&str, Value)>, required: &[&str]) -> Value {
    let properties: Map<String, Value> = properties
        .into_iter()
        .map(|(name, schema)| (name.to_string(), schema))
        .collect();
    json!({"type": "object", "properties": properties, "required": required})
}

/// Parameters both generation endpoints accept, with the same meaning.
fn shared_generation_properties() -> Vec<(&'static str, Value)> {
    vec![
        (
            "model",
            string("Served model name; optional when one model is served."),
        ),
        (
            "temperature",
            bounded_number(
                "0 to 2; 0 is greedy. Default 1 or the generation config.",
                0.0,
                2.0,
            ),
        ),
        (
            "top_p",
            nullable(json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                "description": "Nucleus mass in (0, 1]. Default 1."})),
        ),
        (
            "n",
            bounded_integer(
                "Number of choices, 1 to --max-n. n > 1 needs temperature > 0.",
                Some(1),
                None,
            ),
        ),
        (
            "stream",
            boolean("Stream chunks as server-sent events, ending with [DONE]."),
        ),
        ("stream_options", nullable(schema_ref("StreamOptions"))),
        (
            "stop",
            nullable(
                json!({"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}}],
            "description": "Stop string(s), none empty; not included in the output unless include_stop_str_in_output."}),
            ),
        ),
        (
            "seed",
            bounded_integer(
                "Any 64-bit integer (signed or unsigned); -1 means unseeded.",
                Some(i128::from(i64::MIN)),
                Some(i128::from(u64::MAX)),
            ),
        ),
        ("presence_penalty", bounded_number("-2 to 2.", -2.0, 2.0)),
        ("frequency_penalty", bounded_number("-2 to 2.", -2.0, 2.0)),
        (
            "logit_bias",
            nullable(
                json!({"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "description": "Token id (as a string) to additive bias in [-100, 100]; ids must be in the vocabulary."}),
            ),
        ),
        ("user", string("Ignored.")),
        ("response_format", nullable(schema_ref("ResponseFormat"))),
        (
            "structured_outputs",
            nullable(schema_ref("StructuredOutputsParams")),
        ),
        (
            "guided_json",
            nullable(json!({"type": ["object", "boolean", "string"],
            "description": "vLLM (legacy): a JSON schema the output must match."})),
        ),
        (
            "guided_regex",
            string("vLLM (legacy): a regex the output must match."),
        ),
        (
            "guided_choice",
            nullable(json!({"type": "array", "items": {"type": "string"},
            "description": "vLLM (legacy): the output is exactly one of these strings."})),
        ),
        (
            "guided_grammar",
            string("vLLM (legacy): a Lark (llguidance) or GBNF (root ::= ...) grammar."),
        ),
        (
            "guided_whitespace_pattern",
            string("vLLM (legacy): whitespace allowed between JSON tokens (a regex)."),
        ),
        (
            "guided_decoding_backend",
            string("vLLM (legacy): 'guidance' or 'auto' (llguidance); others are a 400."),
        ),
        (
            "top_k",
            bounded_integer(
                "vLLM: 0 or -1 disables; else at least 1, at most the vocabulary size.",
                Some(-1),
                None,
            ),
        ),
        ("min_p", bounded_number("vLLM: 0 to 1.", 0.0, 1.0)),
        (
            "repetition_penalty",
            nullable(json!({"type": "number", "exclusiveMinimum": 0, "maximum": f32::MAX,
                "description": "vLLM: greater than 0 (and a finite 32-bit float); 1 disables."})),
        ),
        (
            "length_penalty",
            number("vLLM: beam search only; accepted and ignored."),
        ),
        (
            "use_beam_search",
            boolean("vLLM: true is rejected (not supported)."),
        ),
        (
            "stop_token_ids",
            token_ids("vLLM: extra token ids that end a choice."),
        ),
        (
            "include_stop_str_in_output",
            boolean("vLLM: keep the matched stop string."),
        ),
        ("ignore_eos", boolean("vLLM: keep generating past EOS.")),
        (
            "min_tokens",
            bounded_integer(
                "vLLM: EOS and stop tokens are ignored before this many tokens (at most max_tokens).",
                Some(0),
                None,
            ),
        ),
        ("skip_special_tokens", boolean("vLLM: default true.")),
        (
            "spaces_between_special_tokens",
            boolean("vLLM: default true."),
        ),
        (
            "truncate_prompt_tokens",
            nullable(json!({"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1}],
                "description": "vLLM: keep only the last N prompt tokens (1 to max_model_len); -1 means max_model_len."})),
        ),
        (
            "prompt_logprobs",
            bounded_integer(
                "vLLM: logprobs for prompt tokens, 0 to --max-logprobs; not with stream.",
                Some(0),
                None,
            ),
        ),
        (
            "allowed_token_ids",
            nullable(json!({"type": "array", "items": token_id(), "minItems": 1,
                "description": "vLLM: restrict sampling to these tokens (not empty)."})),
        ),
        (
            "bad_words",
            nullable(
                json!({"type": "array", "items": {"type": "string", "minLength": 1}, "description": "vLLM: words that must not be generated (none blank)."}),
            ),
        ),
        (
            "thinking_token_budget",
            bounded_integer(
                "vLLM: the most tokens the output may spend reasoning; then the reasoning end \
                 marker is forced (needs --reasoning-parser).",
                Some(0),
                Some(i128::from(u32::MAX)),
            ),
        ),
        (
            "priority",
            integer("vLLM: lower is scheduled earlier under priority scheduling. Default 0."),
        ),
        (
            "request_id",
            nullable(json!({"type": "string", "minLength": 1,
                "description": "vLLM: id used in the response id and logs."})),
        ),
        (
            "return_token_ids",
            boolean("vLLM: add token_ids / prompt_token_ids to the response."),
        ),
        (
            "cache_salt",
            nullable(json!({"type": "string", "minLength": 1, "maxLength": 1024,
                "description": "vLLM: 1 to 1024 bytes salting the prefix-cache hashes."})),
        ),
    ]
}

/// A function tool, as `tools::parse_tools` accepts it.
fn tool_schema() -> Value {
    json!({"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"},
            "description": {"type": ["string", "null"]},
            "parameters": {"type": ["object", "null"]},
            "strict": {"type": ["boolean", "null"]}
        }}
    }})
}

fn completion_request_schema() -> Value {
    let mut properties = shared_generation_properties();
    properties.extend([
        ("prompt", json!({"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": DEFAULT_MAX_PROMPTS},
            {"type": "array", "items": token_id(), "minItems": 1},
            {"type": "array", "items": {"type": "array", "items": token_id(), "minItems": 1}, "minItems": 1, "maxItems": DEFAULT_MAX_PROMPTS}
        ], "description": "A prompt, a batch of prompts, token ids, or a batch of token-id lists; \
            none empty, at most 1024 prompts, prompts × n at most the server's sequence cap."})),
        ("suffix", json!({"type": "null", "description": "Not supported; must be null or absent."})),
        ("max_tokens", bounded_integer("Default 16; at least 1, or 0 with echo (score the prompt only).", Some(0), None)),
        ("logprobs", bounded_integer("Legacy logprobs: top alternatives per token, 0 to --max-logprobs.", Some(0), None)),
        ("echo", boolean("Prepend the prompt (and its logprobs) to each choice.")),
        ("best_of", bounded_integer("Must equal n when set.", Some(1), None)),
        ("add_special_tokens", boolean("vLLM: default true.")),
    ]);
    object(properties, &["prompt"])
}

fn chat_request_schema() -> Value {
    let mut properties = shared_generation_properties();
    properties.extend([
        ("messages", json!({"type": "array", "minItems": 1, "items": schema_ref("ChatMessage")})),
        ("max_tokens", bounded_integer("Deprecated alias of max_completion_tokens.", Some(1), None)),
        ("max_completion_tokens", bounded_integer("Default: the rest of the context.", Some(1), None)),
        ("logprobs", boolean("Return the sampled tokens' logprobs.")),
        ("top_logprobs", bounded_integer("0 to --max-logprobs alternatives per token; needs logprobs.", Some(0), None)),
        ("tools", nullable(json!({"type": "array", "items": tool_schema(),
            "description": "Function tools ({type: function, function: {name, description, parameters, strict}})."}))),
        ("tool_choice", nullable(json!({"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}],
            "description": "Default auto with tools; auto needs --enable-auto-tool-choice and --tool-call-parser; required and a named function are grammar-constrained."}))),
        ("parallel_tool_calls", boolean("Default true; false allows one call per turn.")),
        ("include_reasoning", boolean("vLLM: with --reasoning-parser, false drops the reasoning.")),
        ("add_generation_prompt", boolean("vLLM: default true (false when continue_final_message).")),
        ("continue_final_message", boolean("vLLM: continue the last (assistant) message.")),
        ("add_special_tokens", boolean("vLLM: default false; the template adds them.")),
        ("chat_template", string("vLLM: a Jinja template overriding the model's.")),
        ("chat_template_kwargs", nullable(json!({"type": "object", "description": "vLLM: extra template variables."}))),
        ("reasoning_effort", nullable(json!({"type": "string", "enum": crate::chat::REASONING_EFFORTS,
            "description": "Handed to the chat template as reasoning_effort (as vLLM); templates with an effort switch read it."}))),
        ("documents", nullable(json!({"type": "array", "items": {"type": "object"}, "description": "vLLM: RAG documents for templates."}))),
        ("echo", boolean("vLLM: prepend the last message when it has the reply's role.")),
    ]);
    object(properties, &["messages"])
}

fn components() -> Value {
    let usage = object(
        vec![
            ("prompt_tokens", json!({"type": "integer"})),
            ("completion_tokens", json!({"type": "integer"})),
            ("total_tokens", json!({"type": "integer"})),
            (
                "prompt_tokens_details",
                object(
                    vec![("cached_tokens", json!({"type": "integer"}))],
                    &["cached_tokens"],
                ),
            ),
        ],
        &["prompt_tokens", "completion_tokens", "total_tokens"],
    );
    let finish_reason = nullable(
        json!({"type": "string", "enum": ["stop", "length", "abort", "error", "tool_calls", "content_filter"]}),
    );
    let stop_reason = nullable(json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}));
    let completion_logprobs = nullable(object(
        vec![
            (
                "tokens",
                json!({"type": "array", "items": {"type": "string"}}),
            ),
            (
                "token_logprobs",
                json!({"type": "array", "items": {"type": ["number", "null"]}}),
            ),
            (
                "top_logprobs",
                json!({"type": "array", "items": {"type": ["object", "null"], "additionalProperties": {"type": "number"}}}),
            ),
            (
                "text_offset",
                json!({"type": "array", "items": {"type": "integer"}}),
            ),
        ],
        &["tokens", "token_logprobs", "top_logprobs", "text_offset"],
    ));
    let top_logprob = object(
        vec![
            ("token", json!({"type": "string"})),
            ("logprob", json!({"type": "number"})),
            (
                "bytes",
                nullable(json!({"type": "array", "items": {"type": "integer"}})),
            ),
        ],
        &["token", "logprob"],
    );
    let chat_logprobs = nullable(object(
        vec![(
            "content",
            nullable(json!({"type": "array", "items": schema_ref("ChatLogprobToken")})),
        )],
        &[],
    ));
    let logprob_token = object(
        vec![
            ("token", json!({"type": "string"})),
            ("logprob", json!({"type": "number"})),
            (
                "bytes",
                nullable(json!({"type": "array", "items": {"type": "integer"}})),
            ),
            (
                "top_logprobs",
                json!({"type": "array", "items": schema_ref("ChatTopLogprob")}),
            ),
        ],
        &["token", "logprob", "top_logprobs"],
    );
    let completion_choice = object(
        vec![
            ("index", json!({"type": "integer"})),
            ("text", json!({"type": "string"})),
            ("logprobs", completion_logprobs.clone()),
            ("finish_reason", finish_reason.clone()),
            ("stop_reason", stop_reason.clone()),
            (
                "token_ids",
                json!({"type": "array", "items": {"type": "integer"}}),
            ),
            (
                "prompt_token_ids",
                json!({"type": "array", "items": {"type": "integer"}}),
            ),
            (
                "prompt_logprobs",
                json!({"type": "array", "items": {"type": ["object", "null"]}}),
            ),
        ],
        &["index", "text", "logprobs", "finish_reason"],
    );
    // `assistant` unless `--response-role` names another (vLLM allows any string).
    let role = json!({"type": "string"});
    let chat_choice = object(
        vec![
            ("index", json!({"type": "integer"})),
            (
                "message",
                object(
                    vec![
                        ("role", role.clone()),
                        ("content", string("")),
                        ("reasoning", json!({"type": "string"})),
                        ("reasoning_content", json!({"type": "string"})),
                        (
                            "tool_calls",
                            json!({"type": "array", "items": {"type": "object", "properties": {
                            "id": {"type": "string"}, "type": {"const": "function"},
                            "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}}),
                        ),
                    ],
                    &["role", "content"],
                ),
            ),
            ("logprobs", chat_logprobs.clone()),
            ("finish_reason", finish_reason.clone()),
            ("stop_reason", stop_reason.clone()),
            (
                "token_ids",
                json!({"type": "array", "items": {"type": "integer"}}),
            ),
        ],
        &["index", "message", "finish_reason"],
    );
    let chat_chunk_choice = object(
        vec![
            ("index", json!({"type": "integer"})),
            (
                "delta",
                object(
                    vec![
                        ("role", role.clone()),
                        ("content", json!({"type": "string"})),
                        ("reasoning", json!({"type": "string"})),
                        ("reasoning_content", json!({"type": "string"})),
                        (
                            "tool_calls",
                            json!({"type": "array", "items": {"type": "object", "required": ["index"], "properties": {
                            "index": {"type": "integer"}, "id": {"type": "string"}, "type": {"const": "function"},
                            "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}}),
                        ),
                    ],
                    &[],
                ),
            ),
            ("logprobs", chat_logprobs),
            ("finish_reason", finish_reason),
            ("stop_reason", stop_reason),
            (
                "token_ids",
                json!({"type": "array", "items": {"type": "integer"}}),
            ),
        ],
        &["index", "delta"],
    );
    let envelope = |object_name: &str, choice: Value, usage_required: bool| {
        let mut required = vec!["id", "object", "created", "model", "choices"];
        if usage_required {
            required.push("usage");
        }
        object(
            vec![
                ("id", json!({"type": "string"})),
                ("object", json!({"const": object_name})),
                (
                    "created",
                    json!({"type": "integer", "description": "Unix seconds."}),
                ),
                ("model", json!({"type": "string"})),
                ("choices", json!({"type": "array", "items": choice})),
                ("usage", schema_ref("Usage")),
                (
                    "prompt_token_ids",
                    json!({"type": "array", "items": {"type": "integer"}}),
                ),
            ],
            &required,
        )
    };
    let content = json!({"anyOf": [
        {"type": "string"},
        {"type": "array", "items": object(vec![
            ("type", json!({"const": "text", "description": "Other part types are rejected."})),
            ("text", json!({"type": "string"})),
        ], &["type", "text"])}
    ]});
    let mut chat_message = object(
        vec![
            (
                "role",
                json!({"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]}),
            ),
            ("content", nullable(content.clone())),
            ("name", string("")),
            ("tool_call_id", string("")),
            (
                "tool_calls",
                nullable(json!({"type": "array", "items": {"type": "object"}})),
            ),
            (
                "reasoning",
                string("An earlier assistant turn's reasoning, for the chat template."),
            ),
            ("reasoning_content", string("`reasoning`'s older name.")),
        ],
        &["role"],
    );
    // What `conversation` checks: every message has content, except an assistant message
    // that makes tool calls; a tool message also names the call it answers.
    chat_message["anyOf"] = json!([
        {"properties": {"role": {"enum": ["system", "developer", "user", "assistant"]}, "content": content},
         "required": ["content"]},
        {"properties": {"role": {"const": "assistant"},
                        "tool_calls": {"type": "array", "minItems": 1}},
         "required": ["tool_calls"]},
        {"properties": {"role": {"const": "tool"}, "content": content},
         "required": ["content", "tool_call_id"]}
    ]);
    let model_card = object(
        vec![
            ("id", json!({"type": "string"})),
            ("object", json!({"const": "model"})),
            ("created", json!({"type": "integer"})),
            ("owned_by", json!({"type": "string"})),
            ("root", string("")),
            ("parent", string("")),
            ("max_model_len", json!({"type": "integer"})),
            (
                "permission",
                json!({"type": "array", "items": {"type": "object"}}),
            ),
            (
                "architecture",
                string("The model's architecture (tokenmill extension)."),
            ),
        ],
        &["id", "object", "created", "owned_by"],
    );
    let tokenize_request = json!({"oneOf": [
        object(vec![
            ("model", string("")),
            ("prompt", json!({"type": "string"})),
            ("add_special_tokens", boolean("Default true.")),
            ("return_token_strs", boolean("Also return each token's text.")),
            // With `messages` the request is the chat form (the second schema).
            ("messages", json!({"type": "null", "description": "Absent or null in this form."})),
        ], &["prompt"]),
        object(vec![
            ("model", string("")),
            ("messages", json!({"type": "array", "minItems": 1, "items": schema_ref("ChatMessage")})),
            ("add_generation_prompt", boolean("Default true.")),
            ("continue_final_message", boolean("")),
            ("add_special_tokens", boolean("Default false.")),
            ("chat_template", string("")),
            ("chat_template_kwargs", nullable(json!({"type": "object"}))),
            ("tools", nullable(json!({"type": "array", "items": tool_schema()}))),
            ("return_token_strs", boolean("Also return each token's text.")),
        ], &["messages"]),
    ]});
    json!({
        "CompletionRequest": completion_request_schema(),
        "ChatCompletionRequest": chat_request_schema(),
        "ChatMessage": chat_message,
        "StreamOptions": object(vec![
            ("include_usage", boolean("Send a final chunk with usage and empty choices.")),
            ("continuous_usage_stats", boolean("vLLM: usage on every chunk.")),
        ], &[]),
        "ResponseFormat": object(vec![
            ("type", json!({"type": "string", "enum": ["text", "json_object", "json_schema"],
                "description": "json_object and json_schema constrain the output (llguidance)."})),
            ("json_schema", nullable(json!({"type": "object",
                "description": "{name, schema, strict}: the output matches schema."}))),
        ], &["type"]),
        "StructuredOutputsParams": object(vec![
            ("json", json!({"type": ["object", "boolean", "string", "null"],
                "description": "A JSON schema the output must match."})),
            ("regex", string("A regex (Rust syntax) the output must match.")),
            ("choice", nullable(json!({"type": "array", "items": {"type": "string"},
                "description": "The output is exactly one of these strings."}))),
            ("grammar", string("A Lark (llguidance) or GBNF (root ::= ...) grammar.")),
            ("json_object", boolean("The output is any JSON object.")),
            ("whitespace_pattern", string("Whitespace allowed between JSON tokens (a regex).")),
            ("structural_tag", json!({"description": "Not supported: a 400."})),
        ], &[]),
        "Usage": usage,
        "ChatTopLogprob": top_logprob,
        "ChatLogprobToken": logprob_token,
        "CompletionResponse": envelope("text_completion", completion_choice.clone(), true),
        "CompletionStreamChunk": envelope("text_completion", completion_choice, false),
        "ChatCompletionResponse": envelope("chat.completion", chat_choice, true),
        "ChatCompletionChunk": envelope("chat.completion.chunk", chat_chunk_choice, false),
        "ModelCard": model_card,
        "ModelList": object(vec![
            ("object", json!({"const": "list"})),
            ("data", json!({"type": "array", "items": schema_ref("ModelCard")})),
        ], &["object", "data"]),
        "TokenizeRequest": tokenize_request,
        "TokenizeResponse": object(vec![
            ("count", json!({"type": "integer"})),
            ("max_model_len", json!({"type": "integer"})),
            ("tokens", json!({"type": "array", "items": {"type": "integer"}})),
            ("token_strs", json!({"type": "array", "items": {"type": "string"}})),
        ], &["count", "max_model_len", "tokens"]),
        "DetokenizeRequest": object(vec![
            ("model", string("")),
            ("tokens", json!({"type": "array", "items": token_id()})),
        ], &["tokens"]),
        "TokenId": {"type": "integer", "minimum": 0, "maximum": u32::MAX,
            "description": "A token id of the served model's vocabulary."},
        "DetokenizeResponse": object(vec![("prompt", json!({"type": "string"}))], &["prompt"]),
        "VersionResponse": object(vec![("version", json!({"type": "string"}))], &["version"]),
        "ErrorResponse": object(vec![("error", object(vec![
            ("message", json!({"type": "string"})),
            ("type", json!({"type": "string"})),
            ("param", string("The request parameter at fault.")),
            ("code", integer("The HTTP status.")),
        ], &["message", "type"]))], &["error"]),
    })
}

fn json_body(schema: &str) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema_ref(schema)}}})
}

fn error_responses(statuses: &[u16]) -> Map<String, Value> {
    statuses
        .iter()
        .map(|status| {
            let description = match status {
                400 => "Invalid request (malformed JSON, bad parameter, prompt too long).",
                401 => "Missing or wrong API key.",
                404 => "Unknown model.",
                408 => "The request body did not arrive within --body-read-timeout.",
                413 => "Request body too large.",
                503 => "Server draining or engine not running.",
                _ => "Error.",
            };
            (
                status.to_string(),
                json!({"description": description,
                       "content": {"application/json": {"schema": schema_ref("ErrorResponse")}}}),
            )
        })
        .collect()
}

fn operation(summary: &str, request: Option<&str>, ok: Value, errors: &[u16]) -> Value {
    let mut responses = error_responses(errors);
    responses.insert("200".to_string(), ok);
    let mut operation = json!({"summary": summary, "responses": responses});
    if let Some(request) = request {
        operation["requestBody"] = json_body(request);
    }
    operation
}

fn ok_json(schema: &str) -> Value {
    json!({"description": "OK", "content": {"application/json": {"schema": schema_ref(schema)}}})
}

/// A JSON response, or with `stream: true` a `text/event-stream` of server-sent events:
/// each event's `data` is one `chunk` object in JSON, the last one is `data: [DONE]`.
/// `itemSchema` (OpenAPI 3.2's way to describe each event of a sequential media type) gives
/// the event's shape; 3.1 tools ignore it and see an event stream, not a JSON body.
fn ok_json_or_stream(schema: &str, chunk: &str) -> Value {
    json!({"description": format!("OK. With stream: true, text/event-stream of `data: <{chunk}>` events ending with `data: [DONE]`."),
    "content": {
        "application/json": {"schema": schema_ref(schema)},
        "text/event-stream": {
            "schema": {"description": format!("Server-sent events: `data: <{chunk} JSON>` per event, then `data: [DONE]`.")},
            "itemSchema": {
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"oneOf": [
                    {"contentMediaType": "application/json", "contentSchema": schema_ref(chunk)},
                    {"const": "[DONE]"}
                ]}}
            }
        }
    }})
}

/// The pooling routes' schemas (`pooling.rs`), served by `--runner pooling`.
fn pooling_components() -> Map<String, Value> {
    let input = json!({"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer", "minimum": 0}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}}
    ], "description": "A text, texts, token ids or lists of token ids; none empty, all of one kind."});
    let texts =
        json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]});
    let truncate = integer(
        "Keep at most this many tokens per input (-1: the model length); \
                            without it a longer input is a 400.",
    );
    let model = string("Served model name; optional when one model is served.");
    let usage = object(
        vec![
            ("prompt_tokens", json!({"type": "integer"})),
            ("total_tokens", json!({"type": "integer"})),
            ("completion_tokens", json!({"type": "integer"})),
        ],
        &["prompt_tokens", "total_tokens"],
    );
    let vector = json!({"anyOf": [{"type": "array", "items": {"type": "number"}},
        {"type": "string", "description": "base64 of little-endian float32"}]});
    let list = |item: Value| {
        object(
            vec![
                ("id", json!({"type": "string"})),
                ("object", json!({"type": "string"})),
                ("created", json!({"type": "integer"})),
                ("model", json!({"type": "string"})),
                ("data", json!({"type": "array", "items": item})),
                ("usage", usage.clone()),
            ],
            &["id", "object", "model", "data", "usage"],
        )
    };
    let schemas = json!({
        "EmbeddingRequest": object(vec![
            ("model", model.clone()),
            ("input", input.clone()),
            ("encoding_format", nullable(json!({"enum": ["float", "base64"]}))),
            ("dimensions", integer("Matryoshka models only: truncate the vector to this width.")),
            ("user", string("Accepted, not used.")),
            ("truncate_prompt_tokens", truncate.clone()),
            ("add_special_tokens", boolean("Add [CLS]/[SEP] around text inputs (default true).")),
            ("normalize", boolean("L2-normalize; default: the model's sentence-transformers config.")),
        ], &["input"]),
        "EmbeddingResponse": list(object(vec![
            ("index", json!({"type": "integer"})),
            ("object", json!({"type": "string"})),
            ("embedding", vector.clone()),
            ("data", vector),
        ], &["index", "object"])),
        "ScoreRequest": object(vec![
            ("model", model.clone()),
            ("text_1", texts.clone()),
            ("text_2", texts),
            ("truncate_prompt_tokens", truncate.clone()),
        ], &["text_1", "text_2"]),
        "ScoreResponse": list(object(vec![
            ("index", json!({"type": "integer"})),
            ("object", json!({"type": "string"})),
            ("score", json!({"type": "number"})),
        ], &["index", "score"])),
        "RerankRequest": object(vec![
            ("model", model.clone()),
            ("query", json!({"type": "string"})),
            ("documents", json!({"type": "array", "items": {"type": "string"}})),
            ("top_n", integer("Return the best n (absent or 0: all).")),
            ("return_documents", boolean("Echo each document (default true).")),
            ("truncate_prompt_tokens", truncate.clone()),
        ], &["query", "documents"]),
        "RerankResponse": object(vec![
            ("id", json!({"type": "string"})),
            ("model", json!({"type": "string"})),
            ("usage", object(vec![("total_tokens", json!({"type": "integer"}))], &["total_tokens"])),
            ("results", json!({"type": "array", "items": object(vec![
                ("index", json!({"type": "integer"})),
                ("document", object(vec![("text", json!({"type": "string"}))], &["text"])),
                ("relevance_score", json!({"type": "number"})),
            ], &["index", "relevance_score"])})),
        ], &["id", "model", "usage", "results"]),
        "ClassifyRequest": object(vec![
            ("model", model),
            ("input", input),
            ("truncate_prompt_tokens", truncate),
            ("add_special_tokens", boolean("Add [CLS]/[SEP] around text inputs (default true).")),
        ], &["input"]),
        "ClassifyResponse": list(object(vec![
            ("index", json!({"type": "integer"})),
            ("label", json!({"type": "string"})),
            ("probs", json!({"type": "array", "items": {"type": "number"}})),
            ("num_classes", json!({"type": "integer"})),
        ], &["index", "label", "probs", "num_classes"])),
    });
    match schemas {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The pooling routes (`--runner pooling`; the generate runner answers them with a 400).
fn pooling_paths() -> Map<String, Value> {
    let errors = [400, 401, 404, 408, 413, 503];
    let mut paths = Map::new();
    let mut add = |path: &str, summary: &str, request: &str, response: &str| {
        paths.insert(
            path.to_string(),
            json!({"post": operation(summary, Some(request), ok_json(response), &errors)}),
        );
    };
    add(
        "/v1/embeddings",
        "Embed texts or token ids (pooling models)",
        "EmbeddingRequest",
        "EmbeddingResponse",
    );
    add(
        "/pooling",
        "The model's pooled output (pooling models)",
        "EmbeddingRequest",
        "EmbeddingResponse",
    );
    add(
        "/score",
        "Score text pairs: cosine of embeddings or a cross-encoder",
        "ScoreRequest",
        "ScoreResponse",
    );
    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        add(
            path,
            "Rank documents against a query",
            "RerankRequest",
            "RerankResponse",
        );
    }
    add(
        "/classify",
        "Classify texts (sequence-classification models)",
        "ClassifyRequest",
        "ClassifyResponse",
    );
    paths
}

/// Writes the served model's and server's limits into `document` (from [`openapi_json`]):
/// the vocabulary bounds every token id and `top_k`, the context bounds `max_tokens` and
/// `truncate_prompt_tokens`, `--max-n`, `--max-logprobs` and the prompt-count cap bound
/// theirs, so the schemas reject what the server rejects.
pub fn apply_openapi_limits(document: &mut Value, limits: &ValidationLimits) {
    let schemas = "/components/schemas";
    let vocab_max = limits.vocab_size.saturating_sub(1);
    let mut set = |pointer: String, key: &str, value: Value| {
        if let Some(Value::Object(schema)) = document.pointer_mut(&pointer) {
            schema.insert(key.to_string(), value);
        }
    };
    set(format!("{schemas}/TokenId"), "maximum", json!(vocab_max));
    for request in ["CompletionRequest", "ChatCompletionRequest"] {
        let properties = format!("{schemas}/{request}/properties");
        set(
            format!("{properties}/n/anyOf/0"),
            "maximum",
            json!(limits.max_n),
        );
        set(
            format!("{properties}/top_k/anyOf/0"),
            "maximum",
            json!(limits.vocab_size),
        );
        for logprobs in ["logprobs", "top_logprobs", "prompt_logprobs"] {
            if request == "ChatCompletionRequest" && logprobs == "logprobs" {
                continue; // a boolean there
            }
            set(
                format!("{properties}/{logprobs}/anyOf/0"),
                "maximum",
                json!(limits.max_logprobs),
            );
        }
        for max_tokens in ["max_tokens", "max_completion_tokens"] {
            set(
                format!("{properties}/{max_tokens}/anyOf/0"),
                "maximum",
                json!(limits.max_model_len),
            );
        }
        set(
            format!("{properties}/truncate_prompt_tokens/anyOf/0/anyOf/1"),
            "maximum",
            json!(limits.max_model_len),
        );
    }
    // The Messages API: max_tokens alone must leave room for a prompt.
    set(
        format!("{schemas}/MessagesRequest/properties/max_tokens"),
        "maximum",
        json!(limits.max_model_len.saturating_sub(1)),
    );
    for batch in [1, 3] {
        set(
            format!("{schemas}/CompletionRequest/properties/prompt/anyOf/{batch}"),
            "maxItems",
            json!(limits.max_prompts),
        );
    }
}

/// A closed object (the Messages API refuses unknown fields).
fn closed(properties: Vec<(&str, Value)>, required: &[&str]) -> Value {
    let mut schema = object(properties, required);
    schema["additionalProperties"] = json!(false);
    schema
}

/// `{"type": "<kind>", ...}` as a closed object.
fn tagged(kind: &str, mut properties: Vec<(&str, Value)>, required: &[&str]) -> Value {
    properties.insert(0, ("type", json!({"const": kind})));
    let mut required = required.to_vec();
    required.insert(0, "type");
    closed(properties, &required)
}

/// Anthropic's Messages API schemas (`anthropic.rs`).
fn anthropic_components() -> Map<String, Value> {
    let cache_control = || {
        nullable(closed(
            vec![
                ("type", json!({"const": "ephemeral"})),
                ("ttl", nullable(json!({"enum": ["5m", "1h"]}))),
            ],
            &["type"],
        ))
    };
    let text_block = tagged(
        "text",
        vec![
            ("text", json!({"type": "string"})),
            ("cache_control", cache_control()),
            (
                "citations",
                nullable(json!({"type": "array", "maxItems": 0})),
            ),
        ],
        &["text"],
    );
    let texts = json!({"anyOf": [{"type": "string"}, {"type": "array", "items": schema_ref("AnthropicTextBlock")}]});
    let blocks = vec![
        schema_ref("AnthropicTextBlock"),
        tagged(
            "tool_use",
            vec![
                ("id", json!({"type": "string"})),
                ("name", json!({"type": "string"})),
                ("input", json!({"type": "object"})),
                ("cache_control", cache_control()),
            ],
            &["id", "name", "input"],
        ),
        tagged(
            "tool_result",
            vec![
                ("tool_use_id", json!({"type": "string"})),
                ("content", nullable(texts.clone())),
                (
                    "is_error",
                    boolean("The tool failed; the result is its error."),
                ),
                ("cache_control", cache_control()),
            ],
            &["tool_use_id"],
        ),
        tagged(
            "thinking",
            vec![
                ("thinking", json!({"type": "string"})),
                ("signature", json!({"type": "string"})),
                ("cache_control", cache_control()),
            ],
            &["thinking", "signature"],
        ),
        tagged(
            "redacted_thinking",
            vec![
                ("data", json!({"type": "string"})),
                ("cache_control", cache_control()),
            ],
            &["data"],
        ),
    ];
    let message = closed(
        vec![
            ("role", json!({"enum": ["user", "assistant", "system"]})),
            (
                "content",
                json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"oneOf": blocks}}]}),
            ),
        ],
        &["role", "content"],
    );
    let tool = closed(
        vec![
            ("type", nullable(json!({"const": "custom"}))),
            ("name", json!({"type": "string"})),
            ("description", string("")),
            ("input_schema", json!({"type": "object"})),
            ("cache_control", cache_control()),
        ],
        &["name", "input_schema"],
    );
    let parallel = || {
        (
            "disable_parallel_tool_use",
            boolean("At most one tool call."),
        )
    };
    let tool_choice = nullable(json!({"oneOf": [
        tagged("auto", vec![parallel()], &[]),
        tagged("any", vec![parallel()], &[]),
        tagged("tool", vec![("name", json!({"type": "string"})), parallel()], &["name"]),
        tagged("none", vec![], &[]),
    ]}));
    let display = || {
        (
            "display",
            nullable(json!({"enum": ["summarized", "omitted"]})),
        )
    };
    let thinking = nullable(json!({"oneOf": [
        tagged("enabled", vec![("budget_tokens", json!({"type": "integer", "minimum": 1024,
            "description": "At least 1024 and below max_tokens."})), display()], &["budget_tokens"]),
        tagged("disabled", vec![], &[]),
        tagged("adaptive", vec![display()], &[]),
    ]}));
    let amount = |unit: &str| {
        nullable(closed(
            vec![
                ("type", json!({"const": unit})),
                ("value", json!({"type": "integer", "minimum": 0})),
            ],
            &["type", "value"],
        ))
    };
    let context_management = nullable(closed(
        vec![(
            "edits",
            json!({"type": "array", "items": {"oneOf": [
                tagged("clear_tool_uses_20250919", vec![
                    ("trigger", amount("input_tokens")),
                    ("keep", amount("tool_uses")),
                    ("clear_at_least", amount("input_tokens")),
                    ("exclude_tools", nullable(json!({"type": "array", "items": {"type": "string"}}))),
                    ("clear_tool_inputs", boolean("")),
                ], &[]),
                tagged("clear_thinking_20251015", vec![
                    ("keep", json!({"description": "\"all\" or {\"type\": \"thinking_turns\", \"value\": N} (default 1): the latest assistant turns whose thinking reaches the template."})),
                ], &[]),
            ]}}),
        )],
        &[],
    ));
    let output_config = nullable(closed(
        vec![(
            "format",
            nullable(tagged(
                "json_schema",
                vec![("schema", json!({"type": "object"}))],
                &["schema"],
            )),
        )],
        &[],
    ));
    let prompt_properties = || {
        vec![
            ("model", json!({"type": "string"})),
            (
                "messages",
                json!({"type": "array", "minItems": 1, "items": message.clone()}),
            ),
            ("system", nullable(texts.clone())),
            (
                "tools",
                nullable(json!({"type": "array", "items": tool.clone()})),
            ),
            ("tool_choice", tool_choice.clone()),
            ("thinking", thinking.clone()),
            ("context_management", context_management.clone()),
            ("output_config", output_config.clone()),
            ("cache_control", cache_control()),
        ]
    };
    let mut request = prompt_properties();
    request.extend([
        ("max_tokens", json!({"type": "integer", "minimum": 1})),
        (
            "stop_sequences",
            nullable(json!({"type": "array", "items": {"type": "string"}})),
        ),
        ("temperature", bounded_number("Default 1.", 0.0, 1.0)),
        (
            "top_p",
            nullable(json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1})),
        ),
        ("top_k", integer("")),
        ("stream", boolean("Anthropic's server-sent events.")),
        (
            "metadata",
            nullable(closed(vec![("user_id", string(""))], &[])),
        ),
        (
            "service_tier",
            nullable(json!({"enum": ["auto", "standard_only"]})),
        ),
    ]);
    let usage = object(
        vec![
            ("input_tokens", json!({"type": "integer"})),
            ("output_tokens", json!({"type": "integer"})),
            ("cache_creation_input_tokens", json!({"type": "integer"})),
            ("cache_read_input_tokens", json!({"type": "integer"})),
            ("service_tier", nullable(json!({"type": "string"}))),
        ],
        &["input_tokens", "output_tokens"],
    );
    let response_block = json!({"oneOf": [
        object(vec![("type", json!({"const": "text"})), ("text", json!({"type": "string"}))], &["type", "text"]),
        object(vec![("type", json!({"const": "tool_use"})), ("id", json!({"type": "string"})),
            ("name", json!({"type": "string"})), ("input", json!({"type": "object"}))], &["type", "id", "name", "input"]),
        object(vec![("type", json!({"const": "thinking"})), ("thinking", json!({"type": "string"})),
            ("signature", json!({"type": "string"}))], &["type", "thinking", "signature"]),
    ]});
    let stop_reason =
        nullable(json!({"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}));
    let response = object(
        vec![
            ("id", json!({"type": "string"})),
            ("type", json!({"const": "message"})),
            ("role", json!({"const": "assistant"})),
            (
                "content",
                json!({"type": "array", "items": response_block.clone()}),
            ),
            ("model", json!({"type": "string"})),
            ("stop_reason", stop_reason.clone()),
            ("stop_sequence", nullable(json!({"type": "string"}))),
            ("usage", usage.clone()),
            ("context_management", json!({"type": "object"})),
        ],
        &[
            "id",
            "type",
            "role",
            "content",
            "model",
            "stop_reason",
            "usage",
        ],
    );
    let error_body = object(
        vec![
            ("type", json!({"type": "string"})),
            ("message", json!({"type": "string"})),
        ],
        &["type", "message"],
    );
    let delta = json!({"oneOf": [
        object(vec![("type", json!({"const": "text_delta"})), ("text", json!({"type": "string"}))], &["type", "text"]),
        object(vec![("type", json!({"const": "input_json_delta"})), ("partial_json", json!({"type": "string"}))], &["type", "partial_json"]),
        object(vec![("type", json!({"const": "thinking_delta"})), ("thinking", json!({"type": "string"}))], &["type", "thinking"]),
        object(vec![("type", json!({"const": "signature_delta"})), ("signature", json!({"type": "string"}))], &["type", "signature"]),
    ]});
    let event = |kind: &str, properties: Vec<(&str, Value)>| {
        let required: Vec<&str> = properties.iter().map(|(name, _)| *name).collect();
        let mut all = vec![("type", json!({"const": kind}))];
        all.extend(properties);
        let mut required = required;
        required.insert(0, "type");
        object(all, &required)
    };
    let stream_event = json!({"oneOf": [
        event("message_start", vec![("message", schema_ref("AnthropicMessage"))]),
        event("content_block_start", vec![("index", json!({"type": "integer"})), ("content_block", response_block)]),
        event("content_block_delta", vec![("index", json!({"type": "integer"})), ("delta", delta)]),
        event("content_block_stop", vec![("index", json!({"type": "integer"}))]),
        event("message_delta", vec![("delta", object(vec![("stop_reason", stop_reason), ("stop_sequence", nullable(json!({"type": "string"})))], &["stop_reason"])), ("usage", usage)]),
        event("message_stop", vec![]),
        event("ping", vec![]),
        event("error", vec![("error", error_body.clone())]),
    ]});
    let mut schemas = Map::new();
    schemas.insert("AnthropicTextBlock".into(), text_block);
    schemas.insert(
        "MessagesRequest".into(),
        closed(request, &["model", "max_tokens", "messages"]),
    );
    schemas.insert(
        "CountTokensRequest".into(),
        closed(prompt_properties(), &["model", "messages"]),
    );
    schemas.insert(
        "CountTokensResponse".into(),
        object(
            vec![("input_tokens", json!({"type": "integer"}))],
            &["input_tokens"],
        ),
    );
    schemas.insert("AnthropicMessage".into(), response);
    schemas.insert("AnthropicStreamEvent".into(), stream_event);
    schemas.insert(
        "AnthropicError".into(),
        object(
            vec![("type", json!({"const": "error"})), ("error", error_body)],
            &["type", "error"],
        ),
    );
    schemas
}

/// An operation of the Messages API: Anthropic's error body and statuses, either key header.
fn anthropic_operation(summary: &str, request: &str, ok: Value) -> Value {
    let mut responses = Map::new();
    for (status, description) in [
        (
            400,
            "invalid_request_error: malformed body, unknown or unsupported field, prompt too long.",
        ),
        (401, "authentication_error: missing or wrong API key."),
        (404, "not_found_error: unknown model."),
        (
            408,
            "The request body did not arrive within --body-read-timeout.",
        ),
        (413, "request_too_large: request body too large."),
        (
            529,
            "overloaded_error: server draining, engine not running or queue full.",
        ),
    ] {
        responses.insert(
            status.to_string(),
            json!({"description": description,
                   "content": {"application/json": {"schema": schema_ref("AnthropicError")}}}),
        );
    }
    responses.insert("200".to_string(), ok);
    json!({"summary": summary, "requestBody": json_body(request), "responses": responses,
           "security": [{"bearer": []}, {"x_api_key": []}]})
}

/// The Messages API routes.
fn anthropic_paths() -> Map<String, Value> {
    let stream = json!({"description": "OK. With stream: true, Anthropic's server-sent events (`event: <type>`, `data: <event JSON>`).",
    "content": {
        "application/json": {"schema": schema_ref("AnthropicMessage")},
        "text/event-stream": {
            "schema": {"description": "Server-sent events: `event: <type>` and `data: <AnthropicStreamEvent JSON>` per event."},
            "itemSchema": {
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"contentMediaType": "application/json",
                    "contentSchema": schema_ref("AnthropicStreamEvent")}}
            }
        }
    }});
    let mut paths = Map::new();
    paths.insert(
        "/v1/messages".into(),
        json!({"post": anthropic_operation("Create a message (Anthropic's Messages API)", "MessagesRequest", stream)}),
    );
    paths.insert(
        "/v1/messages/count_tokens".into(),
        json!({"post": anthropic_operation("Count a message request's input tokens", "CountTokensRequest",
            ok_json("CountTokensResponse"))}),
    );
    paths
}

/// Restricts every request's `model` to the names this server answers to (`names`: the
/// served names and any adapters; empty or absent means the first served name). Other names
/// are a 404. Not for a server that registers adapters at run time, whose names change.
pub fn apply_openapi_model_names(document: &mut Value, names: &[String]) {
    let mut allowed = vec![json!("")];
    allowed.extend(names.iter().map(|name| json!(name)));
    let model = nullable(json!({"type": "string", "enum": allowed,
        "description": "A served model name (or a LoRA adapter's); empty or absent: the first served name."}));
    let Some(Value::Object(schemas)) = document.pointer_mut("/components/schemas") else {
        return;
    };
    for schema in schemas.values_mut() {
        let forms: Vec<&mut Value> = if schema.get("oneOf").is_some() {
            match schema.get_mut("oneOf") {
                Some(Value::Array(variants)) => variants.iter_mut().collect(),
                _ => Vec::new(),
            }
        } else {
            vec![schema]
        };
        for form in forms {
            if let Some(Value::Object(properties)) = form.get_mut("properties") {
                if let Some(property) = properties.get_mut("model") {
                    *property = model.clone();
                }
            }
        }
    }
}

/// The OpenAPI 3.1 document for every route tokenmill serves.
pub fn openapi_json() -> Value {
    let mut document = generation_document();
    if let Some(schemas) = document["components"]["schemas"].as_object_mut() {
        schemas.extend(pooling_components());
        schemas.extend(anthropic_components());
        schemas.extend(crate::responses_openapi::components());
    }
    if let Some(paths) = document["paths"].as_object_mut() {
        paths.extend(pooling_paths());
        paths.extend(anthropic_paths());
        paths.extend(crate::responses_openapi::paths());
    }
    document
}

/// The generation server's routes and schemas.
fn generation_document() -> Value {
    let generation_errors = [400, 401, 404, 408, 413, 503];
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "tokenmill",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-compatible (vLLM-compatible) inference server. Unknown request \
                            fields are ignored. Authenticate with `Authorization: Bearer <key>` \
                            when the server has --api-key."
        },
        "components": {
            "schemas": components(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                "x_api_key": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/completions": {"post": operation("Create a completion", Some("CompletionRequest"),
                ok_json_or_stream("CompletionResponse", "CompletionStreamChunk"), &generation_errors)},
            "/v1/chat/completions": {"post": operation("Create a chat completion", Some("ChatCompletionRequest"),
                ok_json_or_stream("ChatCompletionResponse", "ChatCompletionChunk"), &generation_errors)},
            "/v1/models": {"get": operation("List served models", None, ok_json("ModelList"), &[401])},
            "/tokenize": {"post": operation("Tokenize a prompt or a chat", Some("TokenizeRequest"),
                ok_json("TokenizeResponse"), &[400, 401, 404, 408, 413])},
            "/detokenize": {"post": operation("Detokenize token ids", Some("DetokenizeRequest"),
                ok_json("DetokenizeResponse"), &[400, 401, 404, 408, 413])},
            "/version": {"get": operation("Server version", None, ok_json("VersionResponse"), &[401])},
            "/openapi.json": {"get": operation("This document", None,
                json!({"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}), &[401])},
            "/health": {"get": {
                "summary": "Liveness: 200 while the engine runs, 503 while draining or dead",
                "security": [],
                "responses": {"200": {"description": "Alive"}, "503": {"description": "Draining or dead"}}
            }}
        }
    })
}
