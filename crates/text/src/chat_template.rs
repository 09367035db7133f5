//! [`ChatTemplate`]: a conversation → prompt text, with the model's Jinja chat template.
//!
//! Rendering follows Hugging Face's `apply_chat_template` (which vLLM uses): Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python string/dict methods (`.strip()`,
//! `.startswith()`, `.split()`, `.items()` via minijinja-contrib's pycompat), `raise_exception`,
//! `strftime_now`, Python-style `tojson`, and the context `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, `tools`, `documents` plus any `chat_template_kwargs`.

use std::path::Path;

use minijinja::Environment;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Result, TextError};
use crate::template_functions::{raise_exception, strftime_now, tojson};
use crate::tokenizer::{config_chat_template, Tokenizer};

const TEMPLATE_NAME: &str = "chat";

/// Used only when a model ships no chat template: ChatML, which many small instruct models
/// (SmolLM, Qwen) are trained on. vLLM would refuse the request instead; we prefer a usable
/// default and document it.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + \
message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// One message of a conversation in its simplest form. Richer messages (content parts, tool
/// calls with arbitrary fields) can be passed as `serde_json::Value` to [`ChatTemplate::render`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// How message content reaches the template (vLLM's `--chat-template-content-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Content is a string; text parts are joined with "\n". For templates that concatenate it.
    String,
    /// Content stays a list of `{"type": "text", "text": ...}` parts, for templates that loop
    /// over it.
    OpenAi,
}

/// Everything besides the messages that shapes a rendered prompt.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the header that opens an assistant turn.
    pub add_generation_prompt: bool,
    /// Leave the final (assistant) message open so generation continues it; exclusive with
    /// `add_generation_prompt`.
    pub continue_final_message: bool,
    pub bos_token: String,
    pub eos_token: String,
    /// Tool definitions (`tools` in the template; `none` when absent, as transformers passes).
    pub tools: Option<Vec<Value>>,
    /// RAG documents (`documents` in the template).
    pub documents: Option<Vec<Value>>,
    /// Extra variables (vLLM `chat_template_kwargs`, e.g. `enable_thinking`).
    pub chat_template_kwargs: Map<String, Value>,
}

impl RenderOptions {
    /// Options carrying the tokenizer's BOS/EOS strings.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Self {
        RenderOptions {
            bos_token: tokenizer.bos_token(),
            eos_token: tokenizer.eos_token(),
            ..RenderOptions::default()
        }
    }
}

/// Template instructions one render may execute (minijinja's fuel). A model's template over a
/// long conversation uses a few hundred per message; nested loops over a request's data run
/// out instead of holding a thread.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// The longest rendered prompt, in bytes; a render that writes more stops there.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// The widest `indent` (and `tojson(indent=...)`) a template may ask for: one call would
/// otherwise build a string of any size before the output cap sees it.
pub const MAX_INDENT_WIDTH: usize = 256;

/// Collects a render's output, failing the write that would pass [`MAX_RENDERED_BYTES`].
struct CappedOutput {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.over = true;
            return Err(std::io::Error::other("rendered output over the limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `indent` with its width bounded by [`MAX_INDENT_WIDTH`] (minijinja's filter otherwise).
fn bounded_indent(
    value: minijinja::value::StringInput<'_>,
    width: Option<usize>,
    indent_first_line: Option<bool>,
    indent_blank_lines: Option<bool>,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let requested = match width {
        Some(width) => Some(width),
        None => kwargs.peek::<Option<usize>>("width")?,
    };
    if requested.is_some_and(|width| width > MAX_INDENT_WIDTH) {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("indent width over the limit of {MAX_INDENT_WIDTH}"),
        ));
    }
    minijinja::filters::indent(value, width, indent_first_line, indent_blank_lines, kwargs)
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    environment: Environment<'static>,
    source: String,
    content_format: ContentFormat,
    /// With the detected [`ContentFormat::OpenAi`], string content stays a string: the
    /// template tests `content is string` and reads strings itself (Gemma 4's reads its
    /// system prompt as one), as transformers passes them.
    keep_string_content: bool,
}

impl ChatTemplate {
    /// Compiles template source. Syntax errors are [`TextError::TemplateSyntax`].
    pub fn new(source: impl Into<String>) -> Result<Self> {
        let source = source.into();
        let mut environment = Environment::new();
        environment.set_trim_blocks(true);
        environment.set_lstrip_blocks(true);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut environment);
        environment.add_function("raise_exception", raise_exception);
        environment.add_function("strftime_now", strftime_now);
        environment.add_filter("tojson", tojson);
        environment.add_filter("indent", bounded_indent);
        environment.set_fuel(Some(TEMPLATE_FUEL));
        environment
            .add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|error| TextError::TemplateSyntax(describe(&error)))?;
        let content_format = detect_content_format(&source);
        let keep_string_content = tests_string_content(&source);
        Ok(ChatTemplate {
            environment,
            source,
            content_format,
            keep_string_content,
        })
    }

    /// The built-in ChatML template ([`CHATML_TEMPLATE`]).
    pub fn chatml() -> Result<Self> {
        ChatTemplate::new(CHATML_TEMPLATE)
    }

    /// The model's own template, or ChatML when it has none.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self> {
        match tokenizer.chat_template() {
            Some(source) => ChatTemplate::new(source),
            None => ChatTemplate::chatml(),
        }
    }

    /// A `--chat-template` argument: a file path, or (as vLLM allows) the template itself when
    /// no such file exists and the text looks like a template.
    pub fn from_argument(argument: &str) -> Result<Self> {
        let path = Path::new(argument);
        if path.is_file() {
            let source = std::fs::read_to_string(path).map_err(|source| TextError::Io {
                path: argument.to_string(),
                source,
            })?;
            // A tokenizer_config.json-style file carries the template under "chat_template".
            if path.extension().is_some_and(|ext| ext == "json") {
                if let Some(template) = serde_json::from_str::<Value>(&source)
                    .ok()
                    .as_ref()
                    .and_then(config_chat_template)
                {
                    return ChatTemplate::new(template);
                }
            }
            return ChatTemplate::new(source);
        }
        if argument.contains("{{") || argument.contains("{%") || argument.contains('\n') {
            return ChatTemplate::new(argument);
        }
        Err(TextError::Io {
            path: argument.to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "chat template file not found",
            ),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Overrides the detected content format.
    pub fn set_content_format(&mut self, format: ContentFormat) {
        self.content_format = format;
        self.keep_string_content = false;
    }

    /// Renders plain messages.
    pub fn render_messages(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<String> {
        let values = messages
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|error| TextError::InvalidChat(error.to_string()))?;
        self.render(&values, options)
    }

    /// Renders messages given as JSON objects (`role`, `content` as a string, null or a list of
    /// parts, and any other fields the template reads, e.g. `tool_calls`, `name`).
    pub fn render(&self, messages: &[Value], options: &RenderOptions) -> Result<String> {
        if options.add_generation_prompt && options.continue_final_message {
            return Err(TextError::InvalidChat(
                "continue_final_message and add_generation_prompt cannot both be true".to_string(),
            ));
        }
        let messages = messages
            .iter()
            .map(|message| {
                normalize_message(message, self.content_format, self.keep_string_content)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut context = options.chat_template_kwargs.clone();
        context.insert("messages".to_string(), Value::Array(messages.clone()));
        context.insert(
            "add_generation_prompt".to_string(),
            Value::Bool(options.add_generation_prompt),
        );
        context.insert(
            "bos_token".to_string(),
            Value::String(options.bos_token.clone()),
        );
        context.insert(
            "eos_token".to_string(),
            Value::String(options.eos_token.clone()),
        );
        context.insert(
            "tools".to_string(),
            options.tools.clone().map_or(Value::Null, Value::Array),
        );
        context.insert(
            "documents".to_string(),
            options.documents.clone().map_or(Value::Null, Value::Array),
        );
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(|error| TextError::TemplateSyntax(describe(&error)))?;
        let mut output = CappedOutput {
            bytes: Vec::new(),
            over: false,
        };
        let rendered = template.render_captured_to(
            minijinja::Value::from_serialize(Value::Object(context)),
            &mut output,
        );
        if let Err(error) = rendered {
            return Err(if output.over {
                TextError::TemplateLimit(format!(
                    "the rendered prompt is over the limit of {MAX_RENDERED_BYTES} bytes"
                ))
            } else if error.kind() == minijinja::ErrorKind::OutOfFuel {
                TextError::TemplateLimit(format!(
                    "the template ran more than {TEMPLATE_FUEL} instructions (its fuel limit)"
                ))
            } else {
                TextError::TemplateRender(describe(&error))
            });
        }
        let rendered = String::from_utf8(output.bytes)
            .map_err(|error| TextError::TemplateRender(error.to_string()))?;
        if options.continue_final_message {
            return continue_final_message(rendered, &messages);
        }
        Ok(rendered)
    }

    /// Whether the template puts `tools` into the prompt (llama.cpp's probe: render a turn
    /// with a made-up tool and look for its name). A template that does not gets the tools
    /// described in a system prompt instead (the server's generic mode).
    pub fn renders_tools(&self) -> bool {
        const PROBE: &str = "tokenmill_probe_tool_7f3a";
        let options = RenderOptions {
            add_generation_prompt: true,
            tools: Some(vec![serde_json::json!({"type": "function", "function": {
                "name": PROBE, "description": "probe",
                "parameters": {"type": "object", "properties": {}}}})]),
            ..RenderOptions::default()
        };
        let messages = [serde_json::json!({"role": "user", "content": "hi"})];
        self.render(&messages, &options)
            .is_ok_and(|prompt| prompt.contains(PROBE))
    }
}

/// minijinja's message plus the chain of causes (where the template raised, the failing line).
fn describe(error: &minijinja::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// vLLM's auto-detection, approximated on the source: a template with a `for` loop over
/// something's `content` wants the parts list; everything else gets a string.
fn detect_content_format(source: &str) -> ContentFormat {
    let compact: String = source.chars().filter(|c| !c.is_whitespace()).collect();
    let loops_over_content = compact
        .split("{%")
        .filter_map(|tag| tag.trim_start_matches(['-', '+']).strip_prefix("for"))
        .any(|tag| {
            let header = tag
                .split("%}")
                .next()
                .unwrap_or_default()
                .trim_end_matches(['-', '+']);
            let iterable = header
                .split_once("in")
                .map(|(_, rest)| rest)
                .unwrap_or_default();
            let iterable = iterable.split(['|', ')']).next().unwrap_or_default();
            let iterable = iterable.split("if").next().unwrap_or_default();
            iterable == "content"
                || iterable.ends_with("['content']")
                || iterable.ends_with("[\"content\"]")
                || iterable.ends_with(".content")
        });
    if loops_over_content {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// Whether the template tests a message's content for being a string (`message['content']
/// is string`), so it reads string content as well as a list of parts.
fn tests_string_content(source: &str) -> bool {
    let compact: String = source.chars().filter(|c| !c.is_whitespace()).collect();
    [
        "['content']isstring",
        "[\"content\"]isstring",
        ".contentisstring",
    ]
    .iter()
    .any(|test| compact.contains(test))
}

/// The text of a message's content: the string itself, or its text parts.
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Null => Some(String::new()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|part| match part {
                    Value::String(text) => Some(text.as_str()),
                    Value::Object(fields) => fields.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// Brings a message into the shape templates expect, as vLLM does: content per the content
/// format, and tool-call `arguments` given as a JSON string parsed into an object.
fn normalize_message(
    message: &Value,
    format: ContentFormat,
    keep_string_content: bool,
) -> Result<Value> {
    let Value::Object(fields) = message else {
        return Err(TextError::InvalidChat(
            "each message must be an object".to_string(),
        ));
    };
    let mut fields = fields.clone();
    if !fields.get("role").is_some_and(Value::is_string) {
        return Err(TextError::InvalidChat(
            "each message needs a string \"role\"".to_string(),
        ));
    }
    let content = fields.get("content").cloned().unwrap_or(Value::Null);
    let content = match (format, &content) {
        (ContentFormat::OpenAi, Value::String(_)) if keep_string_content => content,
        (ContentFormat::OpenAi, Value::String(text)) => {
            serde_json::json!([{"type": "text", "text": text}])
        }
        (ContentFormat::OpenAi, Value::Array(_) | Value::Null) => content,
        (ContentFormat::String, _) => Value::String(content_text(&content).ok_or_else(|| {
            TextError::InvalidChat(
                "message content must be a string or a list of parts".to_string(),
            )
        })?),
        _ => {
            return Err(TextError::InvalidChat(
                "message content must be a string or a list of parts".to_string(),
            ))
        }
    };
    fields.insert("content".to_string(), content);
    if let Some(Value::Array(calls)) = fields.get_mut("tool_calls") {
        for call in calls {
            if let Some(function) = call.get_mut("function") {
                if let Some(Value::String(arguments)) = function.get("arguments") {
                    if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(arguments)
                    {
                        function["arguments"] = parsed;
                    }
                }
            }
        }
    }
    Ok(Value::Object(fields))
}

/// transformers' `continue_final_message`: cut the rendered prompt right after the final
/// message's content, dropping the end-of-turn the template closed it with.
fn continue_final_message(rendered: String, messages: &[Value]) -> Result<String> {
    let final_content = messages
        .last()
        .and_then(|message| message.get("content"))
        .and_then(content_text)
        .ok_or_else(|| {
            TextError::InvalidChat(
                "continue_final_message needs a final message with text".to_string(),
            )
        })?;
    let stripped = final_content.trim();
    let location = rendered.rfind(stripped).ok_or_else(|| {
        TextError::InvalidChat(
            "continue_final_message is set but the final message does not appear in the rendered chat".to_string(),
        )
    })?;
    let left_trimmed = final_content.trim_start();
    let end = if rendered[location..].starts_with(left_trimmed)
        && left_trimmed.len() == final_content.len()
    {
        location + left_trimmed.len()
    } else {
        location + stripped.len()
    };
    Ok(rendered[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> RenderOptions {
        RenderOptions {
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            ..RenderOptions::default()
        }
    }

    #[test]
    fn hostile_templates_stop_at_their_limits() {
        let messages = [serde_json::json!({"role": "user", "content": "hi"})];
        let limited = |source: &str| {
            let started = std::time::Instant::now();
            let error = ChatTemplate::new(source)
                .unwrap()
                .render(&messages, &options())
                .unwrap_err();
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "{source}: {:?}",
                started.elapsed()
            );
            error
        };
        // Nested loops: out of fuel.
        let error = limited(
            "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}\
             {% endfor %}{% endfor %}{% endfor %}",
        );
        assert!(
            matches!(&error, TextError::TemplateLimit(m) if m.contains("fuel")),
            "{error}"
        );
        // One huge filter call: refused before the string is built.
        for source in [
            "{{ messages[0].content | indent(1000000000) }}",
            "{{ messages | tojson(indent=1000000000) }}",
        ] {
            let error = limited(source);
            assert!(error.to_string().contains("limit"), "{source}: {error}");
        }
        // A lot of output from few instructions: the output cap.
        let error = limited(
            "{% for a in range(1000) %}{% for b in range(100) %}{{ 'x' * 1000 }}\
             {% endfor %}{% endfor %}",
        );
        assert!(
            matches!(&error, TextError::TemplateLimit(m) if m.contains("bytes")),
            "{error}"
        );
        // Ordinary indentation still works.
        let prompt = ChatTemplate::new("{{ 'a\nb' | indent(2) }}")
            .unwrap()
            .render(&messages, &options())
            .unwrap();
        assert_eq!(prompt, "a\n  b");
    }

    #[test]
    fn chatml_fallback_renders_generation_prompt() {
        let template = ChatTemplate::chatml().unwrap();
        let mut options = options();
        options.add_generation_prompt = true;
        let prompt = template
            .render_messages(&[ChatMessage::new("user", "Hi")], &options)
            .unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn syntax_and_render_errors_are_typed() {
        assert!(matches!(
            ChatTemplate::new("{% for %}"),
            Err(TextError::TemplateSyntax(_))
        ));
        let template =
            ChatTemplate::new("{{ raise_exception('only user/assistant roles') }}").unwrap();
        let error = template
            .render_messages(&[ChatMessage::new("user", "x")], &options())
            .unwrap_err();
        assert!(
            matches!(&error, TextError::TemplateRender(message) if message.contains("only user/assistant roles")),
            "{error}"
        );
    }

    #[test]
    fn text_parts_are_joined_for_string_templates_and_kept_for_loops() {
        let messages = vec![serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        })];
        let string_template = ChatTemplate::new("{{ messages[0].content }}").unwrap();
        assert_eq!(
            string_template.render(&messages, &options()).unwrap(),
            "a\nb"
        );
        let loop_template =
            ChatTemplate::new("{% for m in messages %}{% for part in m['content'] %}[{{ part.text }}]{% endfor %}{% endfor %}").unwrap();
        assert_eq!(loop_template.content_format(), ContentFormat::OpenAi);
        assert_eq!(
            loop_template.render(&messages, &options()).unwrap(),
            "[a][b]"
        );
    }

    #[test]
    fn content_format_detection() {
        let detect = |source: &str| detect_content_format(source);
        assert_eq!(
            detect("{%- for item in message.content %}{% endfor %}"),
            ContentFormat::OpenAi
        );
        assert_eq!(
            detect("{% for c in message[\"content\"] | selectattr('type') %}{% endfor %}"),
            ContentFormat::OpenAi
        );
        assert_eq!(
            detect("{% for message in messages %}{{ message['content'] }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(detect(CHATML_TEMPLATE), ContentFormat::String);
    }

    #[test]
    fn tool_call_arguments_string_becomes_object() {
        let template =
            ChatTemplate::new("{{ messages[0].tool_calls[0].function.arguments.city }}").unwrap();
        let messages = vec![serde_json::json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Paris\"}"}}]
        })];
        assert_eq!(template.render(&messages, &options()).unwrap(), "Paris");
    }

    #[test]
    fn kwargs_reach_the_template_and_python_methods_work() {
        let template = ChatTemplate::new(
            "{{ messages[0].content.strip().upper() }}{% if enable_thinking is defined and not enable_thinking %}!{% endif %}{{ strftime_now('%Y')|length }}",
        )
        .unwrap();
        let mut options = options();
        options
            .chat_template_kwargs
            .insert("enable_thinking".into(), Value::Bool(false));
        let prompt = template
            .render_messages(&[ChatMessage::new("user", "  hi ")], &options)
            .unwrap();
        assert_eq!(prompt, "HI!4");
    }

    #[test]
    fn continue_final_message_and_generation_prompt_are_exclusive() {
        let template = ChatTemplate::chatml().unwrap();
        let mut options = options();
        options.add_generation_prompt = true;
        options.continue_final_message = true;
        let error = template
            .render_messages(&[ChatMessage::new("assistant", "x")], &options)
            .unwrap_err();
        assert!(matches!(error, TextError::InvalidChat(_)));
    }

    #[test]
    fn continue_final_message_keeps_trailing_space_the_template_kept() {
        let template = ChatTemplate::chatml().unwrap();
        let mut options = options();
        options.continue_final_message = true;
        let messages = [
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Sure, "),
        ];
        let prompt = template.render_messages(&messages, &options).unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure, "
        );
    }

    #[test]
    fn tool_support_is_probed_by_rendering() {
        assert!(!ChatTemplate::chatml().unwrap().renders_tools());
        let with_tools = ChatTemplate::new(
            "{% if tools %}{% for t in tools %}{{ t.function.name }}{% endfor %}{% endif %}\
             {% for m in messages %}{{ m.content }}{% endfor %}",
        )
        .unwrap();
        assert!(with_tools.renders_tools());
    }

    #[test]
    fn argument_accepts_inline_template_config_json_and_rejects_missing_file() {
        assert!(ChatTemplate::from_argument("{{ messages[0].content }}").is_ok());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("tokenizer_config.json");
        let json = serde_json::json!({"chat_template": [{"name": "default", "template": "[{{ messages[0].content }}]"}]});
        std::fs::write(&config, json.to_string()).unwrap();
        let template = ChatTemplate::from_argument(config.to_str().unwrap()).unwrap();
        assert_eq!(
            template
                .render_messages(&[ChatMessage::new("user", "x")], &options())
                .unwrap(),
            "[x]"
        );
        let jinja = dir.path().join("template.jinja");
        std::fs::write(&jinja, "{{ bos_token }}{{ messages | length }}").unwrap();
        let template = ChatTemplate::from_argument(jinja.to_str().unwrap()).unwrap();
        assert_eq!(
            template
                .render_messages(&[ChatMessage::new("user", "x")], &options())
                .unwrap(),
            "<s>1"
        );
        assert!(matches!(
            ChatTemplate::from_argument("/no/such/template.jinja"),
            Err(TextError::Io { .. })
        ));
    }
}
