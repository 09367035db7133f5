//! `tokenmill generate`: one prompt streamed to stdout, or a JSONL batch through the engine.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use tokenmill_engine::{
    generate_batch, BatchItem, Engine, EngineClient, GenerateRequest, LoadedModel, RequestEvent,
    SamplingParams, StopOptions,
};
use tokenmill_models::StructuredOutput;
use tokenmill_protocol::{
    conversation, plan_tools, prepare_tool_history, GuidedDecodingParams, ToolOutput, ToolPlan,
    ToolSettings,
};
use tokenmill_server::chat_output::OutputReading;
use tokenmill_text::{ChatMessage, RenderOptions};

use crate::engine_args::EngineArgs;
use crate::lora_args::LoraArgs;
use crate::tool_args::ToolArgs;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub tools: ToolArgs,
    /// Adapters a `--input` line picks with its `model` field.
    #[command(flatten)]
    pub lora: LoraArgs,
    /// The prompt to complete.
    #[arg(long, required_unless_present = "input", conflicts_with = "input")]
    pub prompt: Option<String>,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// JSONL file of prompts ({"prompt": ...} or {"messages": [...]}, plus sampling fields,
    /// tools/tool_choice/parallel_tool_calls and `model`, a --lora-modules adapter name; an
    /// unknown field is an error).
    #[arg(long, requires = "output")]
    pub input: Option<PathBuf>,
    /// Where the batch's results go, one JSON line per input line, in input order.
    #[arg(long)]
    pub output: Option<PathBuf>,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long)]
    pub ignore_eos: bool,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let (tools, reasoning_parser) = args.tools.settings()?;
    let reasoning_parser = args
        .engine
        .structured_outputs
        .reasoning_parser(reasoning_parser)?;
    let tool_settings = (tools, reasoning_parser);
    let mut config = args.engine.to_config()?;
    config.log_stats_interval = None;
    config.lora = args.lora.to_config()?;
    if args.lora.allow_runtime_lora_updating {
        bail!("--allow-runtime-lora-updating applies to `serve` only");
    }
    if config.lora.is_some() && args.input.is_none() {
        bail!("--enable-lora applies to --input batches, whose lines pick an adapter by `model`");
    }
    let load_started = Instant::now();
    let engine = Engine::start(&config)?;
    let load_time = load_started.elapsed();
    for line in engine.capacity().log_lines() {
        tracing::info!("{line}");
    }
    eprintln!(
        "loaded {} in {:.2} s",
        config.model.path().display(),
        load_time.as_secs_f64()
    );
    match (&args.prompt, &args.input, &args.output) {
        (Some(prompt), _, _) => run_single(&engine, &args, prompt),
        (None, Some(input), Some(output)) => {
            run_batch(&engine, &args, &tool_settings, input, output)
        }
        _ => bail!("give --prompt, or --input with --output"),
    }
}

fn sampling_from_args(args: &GenerateArgs) -> SamplingParams {
    SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        seed: args.seed,
        ..SamplingParams::default()
    }
}

fn prompt_tokens(
    model: &LoadedModel,
    text: Option<&str>,
    messages: Option<&[ChatMessage]>,
) -> anyhow::Result<Vec<u32>> {
    let rendered;
    let text = match (text, messages) {
        (_, Some(messages)) => {
            let mut options = RenderOptions::for_tokenizer(&model.tokenizer);
            options.add_generation_prompt = true;
            rendered = model.chat_template.render_messages(messages, &options)?;
            // The template already placed BOS and other special tokens.
            return Ok(model.tokenizer.encode(&rendered, false)?);
        }
        (Some(text), None) => text,
        (None, None) => bail!("a prompt needs \"prompt\" or \"messages\""),
    };
    Ok(model.tokenizer.encode(text, true)?)
}

fn run_single(engine: &Engine, args: &GenerateArgs, prompt: &str) -> anyhow::Result<()> {
    let model = engine.model();
    let prompt_ids = if args.chat {
        let messages = [ChatMessage::new("user", prompt)];
        prompt_tokens(model, None, Some(&messages))?
    } else {
        prompt_tokens(model, Some(prompt), None)?
    };
    let mut request = GenerateRequest::new(prompt_ids);
    request.sampling = sampling_from_args(args);
    request.stop = StopOptions {
        max_tokens: Some(args.max_tokens),
        ignore_eos: args.ignore_eos,
        ..StopOptions::default()
    };
    let started = Instant::now();
    let mut stream = engine.client().add_request(request)?;
    let mut first_token_at = None;
    let mut output_tokens = 0usize;
    let mut prompt_len = 0usize;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    while let Some(event) = stream.blocking_recv() {
        match event {
            RequestEvent::Output(output) => {
                if first_token_at.is_none() && !output.new_token_ids.is_empty() {
                    first_token_at = Some(started.elapsed());
                }
                output_tokens = output.num_output_tokens;
                prompt_len = output.num_prompt_tokens;
                out.write_all(output.new_text.as_bytes())?;
                out.flush()?;
                if let Some(reason) = output.finish_reason {
                    writeln!(out)?;
                    eprintln!("finish reason: {reason}");
                }
            }
            RequestEvent::Rejected(message) => bail!("request refused: {message}"),
            RequestEvent::Error(message) => bail!("generation failed: {message}"),
            RequestEvent::Failed(failure) => bail!("generation failed: {}", failure.message()),
        }
    }
    let total = started.elapsed().as_secs_f64();
    let ttft = first_token_at.map_or(total, |t| t.as_secs_f64());
    eprintln!(
        "prompt: {prompt_len} tokens, prefill {:.1} tok/s (TTFT {:.1} ms); decode: {} tokens, {:.1} tok/s",
        prompt_len as f64 / ttft.max(1e-9),
        ttft * 1e3,
        output_tokens,
        output_tokens.saturating_sub(1) as f64 / (total - ttft).max(1e-9),
    );
    Ok(())
}

/// One line of a batch input file (the OpenAI API's names). A field not listed here is an
/// error naming it, never silently ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchLine {
    /// A `--lora-modules` adapter name; absent: the base model.
    model: Option<String>,
    prompt: Option<String>,
    /// Chat messages as the API takes them (tool calls and tool results included).
    messages: Option<Vec<tokenmill_protocol::ChatMessage>>,
    tools: Option<Vec<serde_json::Value>>,
    tool_choice: Option<serde_json::Value>,
    parallel_tool_calls: Option<bool>,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    #[serde(default)]
    min_tokens: u32,
    #[serde(default)]
    stop: StopField,
    #[serde(default)]
    ignore_eos: bool,
    /// Structured outputs, as the API takes them (chat's `response_format`, vLLM's
    /// `structured_outputs` and the legacy `guided_*` fields).
    response_format: Option<tokenmill_protocol::ResponseFormat>,
    structured_outputs: Option<tokenmill_protocol::StructuredOutputsParams>,
    guided_json: Option<serde_json::Value>,
    guided_regex: Option<String>,
    guided_choice: Option<Vec<String>>,
    guided_grammar: Option<String>,
    guided_whitespace_pattern: Option<String>,
    guided_decoding_backend: Option<String>,
}

impl BatchLine {
    /// The line's checked structured-output constraint, compiled against the model so a bad
    /// schema fails before anything runs; `None` without one.
    fn structured_output(&self, model: &LoadedModel) -> anyhow::Result<Option<StructuredOutput>> {
        let guided = GuidedDecodingParams {
            structured_outputs: self.structured_outputs.clone(),
            guided_json: self.guided_json.clone(),
            guided_regex: self.guided_regex.clone(),
            guided_choice: self.guided_choice.clone(),
            guided_grammar: self.guided_grammar.clone(),
            guided_whitespace_pattern: self.guided_whitespace_pattern.clone(),
            guided_decoding_backend: self.guided_decoding_backend.clone(),
        };
        let Some(request) = guided.validate(self.response_format.as_ref())? else {
            return Ok(None);
        };
        let output = tokenmill_server::structured_output(&request.constraint);
        model
            .grammar
            .compile(&output)
            .with_context(|| format!("invalid {}", request.param))?;
        Ok(Some(output))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum StopField {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

/// A batch line's prompt: its text, or its conversation rendered with the tool plan (tools to
/// the template or in a system prompt, as the server does).
fn batch_prompt(
    model: &LoadedModel,
    line: &BatchLine,
    plan: &ToolPlan,
    renders_tools: bool,
) -> anyhow::Result<Vec<u32>> {
    let Some(messages) = &line.messages else {
        return prompt_tokens(model, line.prompt.as_deref(), None);
    };
    let mut messages = conversation(messages)?;
    prepare_tool_history(&mut messages, plan.system_prompt.as_deref(), !renders_tools);
    let values = messages
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let mut options = RenderOptions::for_tokenizer(&model.tokenizer);
    options.add_generation_prompt = true;
    options.tools = plan.template_tools.clone();
    let rendered = model.chat_template.render(&values, &options)?;
    Ok(model.tokenizer.encode(&rendered, false)?)
}

/// The adapter a line's `model` names (`None`: the base model); an unknown name is an error,
/// as the server's 404 is.
fn line_adapter(
    engine: &EngineClient,
    model: Option<&str>,
) -> anyhow::Result<Option<tokenmill_engine::LoraRequest>> {
    let Some(name) = model else {
        return Ok(None);
    };
    let Some(registry) = engine.lora() else {
        bail!("`model` names a LoRA adapter ({name}), but --enable-lora is not given");
    };
    match registry.get(name)? {
        Some(lora) => Ok(Some(lora)),
        None => bail!("`model`: no LoRA adapter `{name}` (give it with --lora-modules)"),
    }
}

fn run_batch(
    engine: &Engine,
    args: &GenerateArgs,
    (tool_settings, reasoning_parser): &(ToolSettings, Option<String>),
    input: &PathBuf,
    output: &PathBuf,
) -> anyhow::Result<()> {
    let model = engine.model();
    let client = engine.client();
    let renders_tools = model.chat_template.renders_tools();
    let mut readings = Vec::new();
    let file =
        std::fs::File::open(input).with_context(|| format!("cannot open {}", input.display()))?;
    let mut items = Vec::new();
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: BatchLine = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}:{}: not a valid prompt line",
                input.display(),
                number + 1
            )
        })?;
        let location = || format!("{}:{}", input.display(), number + 1);
        let plan = plan_tools(
            parsed.tools.as_deref(),
            parsed.tool_choice.as_ref(),
            parsed.parallel_tool_calls,
            tool_settings,
            renders_tools,
        )
        .with_context(location)?;
        let prompt_ids =
            batch_prompt(model, &parsed, &plan, renders_tools).with_context(location)?;
        let reading = OutputReading::new(&plan, reasoning_parser.as_deref(), true);
        let mut request = GenerateRequest::new(prompt_ids);
        request.lora = line_adapter(&client, parsed.model.as_deref()).with_context(location)?;
        let mut sampling = sampling_from_args(args);
        if let Some(t) = parsed.temperature {
            sampling.temperature = t;
        }
        if let Some(p) = parsed.top_p {
            sampling.top_p = p;
        }
        if parsed.top_k.is_some() {
            sampling.top_k = parsed.top_k;
        }
        if parsed.seed.is_some() {
            sampling.seed = parsed.seed;
        }
        let overrides = [
            (&mut sampling.min_p, parsed.min_p),
            (&mut sampling.repetition_penalty, parsed.repetition_penalty),
            (&mut sampling.presence_penalty, parsed.presence_penalty),
            (&mut sampling.frequency_penalty, parsed.frequency_penalty),
        ];
        for (field, value) in overrides {
            if let Some(value) = value {
                *field = value;
            }
        }
        sampling.min_tokens = parsed.min_tokens;
        sampling.structured_output = parsed.structured_output(model).with_context(location)?;
        if let ToolOutput::Envelope { schema, .. } = &plan.output {
            if sampling.structured_output.is_some() {
                bail!(
                    "{}: a structured output cannot be combined with a forced tool_choice: both \
                     constrain the output",
                    location()
                );
            }
            sampling.structured_output = Some(StructuredOutput::JsonSchema(schema.clone()));
        }
        if reading.needs_special_tokens() {
            request.decode.skip_special_tokens = false;
        }
        readings.push((reading, parsed.tools.is_some()));
        request.sampling = sampling;
        request.stop = StopOptions {
            max_tokens: Some(parsed.max_tokens.unwrap_or(args.max_tokens)),
            ignore_eos: parsed.ignore_eos || args.ignore_eos,
            stop_strings: match parsed.stop {
                StopField::None => Vec::new(),
                StopField::One(s) => vec![s],
                StopField::Many(v) => v,
            },
            ..StopOptions::default()
        };
        items.push(BatchItem { request });
    }
    let started = Instant::now();
    let results = generate_batch(&client, items, true)?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut writer = BufWriter::new(
        std::fs::File::create(output)
            .with_context(|| format!("cannot create {}", output.display()))?,
    );
    let mut total_out = 0usize;
    for result in &results {
        total_out += result.token_ids.len();
        let (reading, has_tools) = &readings[result.index];
        let mut reader = reading.choice();
        let parsed = reader.complete(&result.text);
        let finish_reason = match result.finish_reason.map(|r| r.as_str()) {
            Some("stop") if reader.called() => Some("tool_calls"),
            other => other,
        };
        let mut line = serde_json::json!({
            "index": result.index,
            "text": result.text,
            "token_ids": result.token_ids,
            "finish_reason": finish_reason,
            "error": result.error,
            "usage": {
                "prompt_tokens": result.num_prompt_tokens,
                "completion_tokens": result.token_ids.len(),
                "total_tokens": result.num_prompt_tokens + result.token_ids.len(),
                "prompt_tokens_details": {"cached_tokens": result.num_cached_tokens},
            },
        });
        if *has_tools || parsed.reasoning.is_some() {
            let content = (parsed.tool_calls.is_empty() || !parsed.content.is_empty())
                .then_some(&parsed.content);
            line["content"] = serde_json::json!(content);
            line["reasoning"] = serde_json::json!(parsed.reasoning);
            line["tool_calls"] = serde_json::to_value(&parsed.tool_calls)?;
        }
        writeln!(writer, "{line}")?;
    }
    writer.flush()?;
    eprintln!(
        "{} requests in {:.2} s, {:.1} output tok/s",
        results.len(),
        elapsed,
        total_out as f64 / elapsed.max(1e-9)
    );
    Ok(())
}
