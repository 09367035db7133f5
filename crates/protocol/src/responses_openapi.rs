//! The Responses API's part of `/openapi.json`: its five routes and the request schema
//! (closed, as the route refuses unknown fields; items and tools are checked by the server).

use serde_json::{json, Map, Value};

fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn error(description: &str) -> Value {
    json!({"description": description,
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
}

fn responses(ok: Value, errors: &[(u16, &str)]) -> Value {
    let mut map = Map::new();
    map.insert("200".into(), ok);
    for (status, description) in errors {
        map.insert(status.to_string(), error(description));
    }
    Value::Object(map)
}

const NOT_FOUND: (u16, &str) = (404, "No stored response (or run) with this id.");
const UNAUTHORIZED: (u16, &str) = (401, "Missing or wrong API key.");

fn id_parameter() -> Value {
    json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}})
}

fn query(name: &str, schema: Value) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema})
}

/// The `ResponsesRequest` schema.
pub(crate) fn components() -> Map<String, Value> {
    let string = || nullable(json!({"type": "string"}));
    let boolean = || nullable(json!({"type": "boolean"}));
    let number = || nullable(json!({"type": "number"}));
    let integer = || nullable(json!({"type": "integer"}));
    let object = || nullable(json!({"type": "object"}));
    let mut properties = Map::new();
    for (name, schema) in [
        ("model", string()),
        (
            "input",
            json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
            "description": "A string (one user message) or items: message, function_call, function_call_output, custom_tool_call, custom_tool_call_output, reasoning."}),
        ),
        ("instructions", string()),
        (
            "tools",
            nullable(json!({"type": "array", "items": {"type": "object"},
            "description": "Function, custom (free-form input) and namespace tools; hosted tools (web_search, ...) are declared but not offered (header x-tokenmill-skipped-tools)."})),
        ),
        (
            "tool_choice",
            nullable(
                json!({"anyOf": [{"type": "string", "enum": ["auto", "none", "required"]}, {"type": "object"}]}),
            ),
        ),
        ("parallel_tool_calls", boolean()),
        ("text", object()),
        ("reasoning", object()),
        ("max_output_tokens", integer()),
        ("temperature", number()),
        ("top_p", number()),
        ("top_logprobs", integer()),
        (
            "include",
            nullable(json!({"type": "array", "items": {"type": "string"}})),
        ),
        (
            "metadata",
            nullable(json!({"type": "object", "additionalProperties": {"type": "string"}})),
        ),
        ("user", string()),
        (
            "truncation",
            nullable(json!({"type": "string", "enum": ["auto", "disabled"]})),
        ),
        ("stream", boolean()),
        ("stream_options", object()),
        ("store", boolean()),
        ("previous_response_id", string()),
        ("background", boolean()),
        (
            "service_tier",
            nullable(json!({"type": "string", "enum": ["auto", "default"]})),
        ),
        ("top_k", integer()),
        ("min_p", number()),
        ("repetition_penalty", number()),
        ("presence_penalty", number()),
        ("frequency_penalty", number()),
        ("seed", integer()),
        (
            "stop",
            nullable(
                json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
            ),
        ),
        (
            "stop_token_ids",
            nullable(json!({"type": "array", "items": {"type": "integer", "minimum": 0}})),
        ),
        ("ignore_eos", boolean()),
        ("min_tokens", integer()),
        ("include_stop_str_in_output", boolean()),
        ("skip_special_tokens", boolean()),
        (
            "logit_bias",
            nullable(json!({"type": "object", "additionalProperties": {"type": "number"}})),
        ),
        (
            "allowed_token_ids",
            nullable(json!({"type": "array", "items": {"type": "integer", "minimum": 0}})),
        ),
        (
            "bad_words",
            nullable(json!({"type": "array", "items": {"type": "string"}})),
        ),
        ("priority", integer()),
        ("request_id", string()),
        ("cache_salt", string()),
        ("prompt_cache_key", string()),
        (
            "client_metadata",
            nullable(json!({"type": "object", "additionalProperties": {"type": "string"}})),
        ),
    ] {
        properties.insert(name.into(), schema);
    }
    let mut schemas = Map::new();
    schemas.insert(
        "ResponsesRequest".into(),
        json!({"type": "object", "properties": properties, "required": ["input"],
               "additionalProperties": false}),
    );
    schemas.insert(
        "ResponseObject".into(),
        json!({"type": "object", "required": ["id", "object", "status"],
               "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                              "status": {"type": "string"}}}),
    );
    schemas
}

/// The five routes.
pub(crate) fn paths() -> Map<String, Value> {
    let object = json!({"description": "OK", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResponseObject"}}}});
    let stream = json!({"description": "OK. With stream: true, server-sent events `event: <type>`, `data: <event JSON with sequence_number>`.",
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ResponseObject"}},
        "text/event-stream": {"schema": {"description": "Responses stream events."}}
    }});
    let create_errors = [
        (
            400,
            "Invalid request: unknown or unsupported field, item or tool type, prompt too long.",
        ),
        UNAUTHORIZED,
        (404, "Unknown model or previous_response_id."),
        (
            408,
            "The request body did not arrive within --body-read-timeout.",
        ),
        (413, "Request body too large."),
        (503, "Server draining or engine not running."),
    ];
    let mut paths = Map::new();
    paths.insert(
        "/v1/responses".into(),
        json!({"post": {"summary": "Create a response (OpenAI's Responses API)",
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResponsesRequest"}}}},
            "responses": responses(stream.clone(), &create_errors)}}),
    );
    paths.insert(
        "/v1/responses/{id}".into(),
        json!({
            "get": {"summary": "Retrieve a stored response; with stream=true replay a background run's events after starting_after",
                "parameters": [id_parameter(), query("stream", json!({"type": "boolean"})),
                               query("starting_after", json!({"type": "integer", "minimum": 0}))],
                "responses": responses(stream, &[(400, "Bad query parameter, or no event stream to replay."), UNAUTHORIZED, NOT_FOUND])},
            "delete": {"summary": "Delete a stored response",
                "parameters": [id_parameter()],
                "responses": responses(json!({"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}),
                    &[UNAUTHORIZED, NOT_FOUND])}
        }),
    );
    paths.insert(
        "/v1/responses/{id}/input_items".into(),
        json!({"get": {"summary": "List a stored response's input items",
            "parameters": [id_parameter(), query("after", json!({"type": "string"})),
                           query("limit", json!({"type": "integer", "minimum": 1, "maximum": 100})),
                           query("order", json!({"type": "string", "enum": ["asc", "desc"]}))],
            "responses": responses(json!({"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}),
                &[(400, "Bad query parameter."), UNAUTHORIZED, NOT_FOUND])}}),
    );
    paths.insert(
        "/v1/responses/{id}/cancel".into(),
        json!({"post": {"summary": "Cancel a background response (its KV blocks are freed)",
            "parameters": [id_parameter()],
            "responses": responses(object, &[(400, "Not a background response."), UNAUTHORIZED, NOT_FOUND])}}),
    );
    paths
}
