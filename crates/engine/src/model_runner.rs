//! The real executor: flattens a scheduled step into one batch over the paged KV cache, runs
//! the model once, and samples each sequence that needs a token.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tokenmill_core::{RequestId, SchedulerOutput};
use tokenmill_gguf::GgufFile;
use tokenmill_kernels::ThreadPool;
use tokenmill_models::{
    load_gguf_model, load_model, token_logprobs, BatchInput, CausalLm, GrammarCompiler,
    GrammarVocabulary, History, JsonGrammarOptions, KvCacheDType, KvCacheGrouping, KvCacheStorage,
    LoadOptions, LoraAdapter, ModelConfig, ModelError, ModelSource, SampledToken, Sampler,
    StateCacheStorage, Workspace,
};
use tokenmill_text::{ChatTemplate, Tokenizer};

use crate::executor::{Executor, NewSequence, StepOutput};
use crate::request::{RequestFailure, TokenLogprob};
use crate::EngineError;

/// A model with its tokenizer, chat template and compute pool, loaded once and shared.
pub struct LoadedModel {
    /// Where the model was loaded from (its path is the model card's `root`).
    pub source: ModelSource,
    /// Shared by the data-parallel engines ([`LoadedModel::with_own_pool`]).
    pub model: Arc<dyn CausalLm>,
    /// The threads the forward pass and the per-sequence sampling run on.
    pub pool: ThreadPool,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    /// Structured outputs: the token trie over this tokenizer, built once at load, and the
    /// compiled-grammar cache shared by the server's validation and the executor.
    pub grammar: Arc<GrammarCompiler>,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("config", self.model.config())
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Loads weights, tokenizer and chat template from a GGUF file (opened once for both) or
    /// an HF directory, and starts a pool of `num_threads` threads (`None` = all cores).
    /// `chat_template` overrides the model's template (a file path or an inline template),
    /// `tokenizer` the model's tokenizer (an HF tokenizer directory or a `tokenizer.json`).
    pub fn load(
        source: &ModelSource,
        chat_template: Option<&str>,
        tokenizer: Option<&Path>,
        num_threads: Option<usize>,
    ) -> Result<LoadedModel, EngineError> {
        let options = LoadOptions::default();
        let (model, mut tokenizer) = match source {
            ModelSource::Gguf(path) => {
                let file = GgufFile::open(path).map_err(ModelError::from)?;
                let model = load_gguf_model(&file, &options)?;
                let tokenizer = match tokenizer {
                    Some(path) => load_tokenizer_override(path, model.config().vocab_size)?,
                    None => Tokenizer::from_gguf(&file)?,
                };
                (model, tokenizer)
            }
            ModelSource::HfDirectory(dir) => {
                let model = load_model(source, &options)?;
                let tokenizer = match tokenizer {
                    Some(path) => load_tokenizer_override(path, model.config().vocab_size)?,
                    None => Tokenizer::from_hf_dir(dir)?,
                };
                (model, tokenizer)
            }
        };
        // `--chat-template`, else the model's own; a model with neither (a base model such
        // as Gemma 3 270M) gets vLLM's refusal, so chat requests are a 400 naming `messages`
        // while completions work.
        let template = match (chat_template, tokenizer.chat_template()) {
            (Some(argument), _) => ChatTemplate::from_argument(argument)?,
            (None, Some(source)) => ChatTemplate::new(source)?,
            (None, None) => ChatTemplate::new(NO_CHAT_TEMPLATE)?,
        };
        tracing::info!(
            "model family: {} (architecture {}), {} layers{}{}{}",
            model.config().family(),
            model.config().architecture.name(),
            model.config().num_layers,
            model.config().describe_experts(),
            describe_windows(model.kv_layout()),
            describe_shared_kv(model.config()),
        );
        tokenizer.register_chat_template_end_tokens(template.source());
        let grammar = GrammarCompiler::new(&grammar_vocabulary(&tokenizer))?;
        Ok(LoadedModel {
            source: source.clone(),
            model: Arc::from(model),
            pool: num_threads.map_or_else(ThreadPool::default, ThreadPool::new),
            tokenizer: Arc::new(tokenizer),
            chat_template: Arc::new(template),
            grammar: Arc::new(grammar),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// The same weights, tokenizer, template and grammar compiler (shared, not copied) with
    /// a thread pool of its own: one data-parallel engine's view of the model. The pool's
    /// threads start here, so they inherit the calling thread's CPU affinity.
    pub fn with_own_pool(&self, num_threads: usize) -> LoadedModel {
        LoadedModel {
            source: self.source.clone(),
            model: Arc::clone(&self.model),
            pool: ThreadPool::new(num_threads),
            tokenizer: Arc::clone(&self.tokenizer),
            chat_template: Arc::clone(&self.chat_template),
            grammar: Arc::clone(&self.grammar),
        }
    }

    /// `--structured-outputs-config`'s JSON options for every grammar compiled from now on.
    pub fn set_json_grammar_options(
        &mut self,
        options: JsonGrammarOptions,
    ) -> Result<(), EngineError> {
        match Arc::get_mut(&mut self.grammar) {
            Some(compiler) => compiler.set_json_options(options),
            None => {
                // Already shared: a compiler of its own (the trie is rebuilt, once).
                let mut compiler = GrammarCompiler::new(&grammar_vocabulary(&self.tokenizer))?;
                compiler.set_json_options(options);
                self.grammar = Arc::new(compiler);
            }
        }
        Ok(())
    }

    /// Whether chat requests have a template (the model's or `--chat-template`), rather than
    /// vLLM's refusal for a model that ships none.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.source() != NO_CHAT_TEMPLATE
    }
}

/// `--tokenizer`: an HF tokenizer directory, or a `tokenizer.json` (with the
/// `tokenizer_config.json` next to it, if any). Its ids must fit the model's vocabulary.
fn load_tokenizer_override(path: &Path, model_vocab: usize) -> Result<Tokenizer, EngineError> {
    let tokenizer = if path.is_dir() {
        Tokenizer::from_hf_dir(path)?
    } else {
        let config = path.with_file_name("tokenizer_config.json");
        Tokenizer::from_file(path, config.exists().then_some(config.as_path()))?
    };
    if tokenizer.vocab_size() > model_vocab {
        return Err(EngineError::Config(format!(
            "--tokenizer {}: its vocabulary has {} tokens, more than the model's {model_vocab}",
            path.display(),
            tokenizer.vocab_size()
        )));
    }
    Ok(tokenizer)
}

/// The template of a model that ships none, when `--chat-template` gave none either: vLLM's
/// error (transformers 4.44 dropped the default template) raised at render time.
const NO_CHAT_TEMPLATE: &str = "{{ raise_exception('As of transformers v4.44, default chat \
    template is no longer allowed, so you must provide a chat template if the tokenizer does \
    not define one (start the server with --chat-template, or pass chat_template in the \
    request).') }}";

/// `, sliding window 512 on 15 of 18 cached layers` for the start-up line; empty without windows.
fn describe_windows(layout: &[tokenmill_models::LayerKvLayout]) -> String {
    let windows: Vec<usize> = layout.iter().filter_map(|l| l.sliding_window).collect();
    match windows.iter().max() {
        Some(window) => format!(
            ", sliding window {window} on {} of {} cached layers",
            windows.len(),
            layout.len()
        ),
        None => String::new(),
    }
}

/// `, the last 20 layers read an earlier layer's KV (no cache of their own)` for a model with
/// KV-shared layers (Gemma 4's), empty otherwise: why the cache has fewer layers than the
/// model.
fn describe_shared_kv(config: &tokenmill_models::ModelConfig) -> String {
    match config.kv_shared_layers {
        0 => String::new(),
        shared => {
            format!(", the last {shared} layers read an earlier layer's KV (no cache of their own)")
        }
    }
}

/// Every token's bytes, which tokens are control tokens, and the EOS set, for the grammar
/// engine's token trie.
pub fn grammar_vocabulary(tokenizer: &Tokenizer) -> GrammarVocabulary {
    let ids = 0..tokenizer.vocab_size() as u32;
    GrammarVocabulary {
        // An id without a piece (a hole in the vocabulary) can never be text.
        pieces: ids
            .clone()
            .map(|id| tokenizer.token_to_piece(id).unwrap_or_default())
            .collect(),
        special: ids.map(|id| tokenizer.is_special(id)).collect(),
        eos_token_ids: tokenizer
            .eos_token_id()
            .into_iter()
            .chain(tokenizer.eos_token_ids())
            .collect(),
    }
}

/// Per-request sampling state kept across steps.
struct SequenceState {
    sampler: Sampler,
    prompt_token_ids: Vec<u32>,
    output_token_ids: Vec<u32>,
    /// Alternatives per prompt position when prompt logprobs were asked for.
    prompt_logprobs: Option<usize>,
    /// Prompt positions below this already had their logprobs reported (a recompute after
    /// preemption must not report them twice).
    prompt_logprobs_done: usize,
    lora: Option<Arc<LoraAdapter>>,
}

/// What one logits row of a step is for.
#[derive(Debug, Clone, Copy)]
enum LogitsRow {
    /// Sample the sequence's next token; with draft tokens, the first of its verification
    /// rows (the drafts' rows follow it, one `Verify` each).
    Sample(RequestId),
    /// The row after a draft token: verifies the next draft, or gives the bonus token.
    Verify,
    /// The logprob of the prompt token at `position + 1`.
    Prompt(RequestId, usize),
}

/// Runs [`SchedulerOutput`]s through a [`CausalLm`] over a paged [`KvCacheStorage`].
pub struct ModelRunner {
    loaded: Arc<LoadedModel>,
    kv_cache: KvCacheStorage,
    workspace: Workspace,
    batch: BatchInput,
    logits: Vec<f32>,
    sequences: HashMap<RequestId, SequenceState>,
    rows: Vec<LogitsRow>,
}

impl ModelRunner {
    /// A runner over a fresh KV cache of `num_blocks` blocks whose elements are `kv_dtype`,
    /// its layers sharing block tables and buffers as `grouping` says (the scheduler's KV
    /// cache groups).
    pub fn new(
        loaded: Arc<LoadedModel>,
        grouping: KvCacheGrouping,
        num_blocks: usize,
        block_size: usize,
        kv_dtype: KvCacheDType,
    ) -> ModelRunner {
        let kv_cache = KvCacheStorage::grouped(grouping, num_blocks, block_size, kv_dtype);
        ModelRunner {
            loaded,
            kv_cache,
            workspace: Workspace::default(),
            batch: BatchInput::default(),
            logits: Vec::new(),
            sequences: HashMap::new(),
            rows: Vec::new(),
        }
    }

    /// The same runner with `num_slots` recurrent-state slots of the model's
    /// [`CausalLm::state_layout`] inside its KV cache (none for a model without recurrent
    /// layers, whatever `num_slots`): the scheduler's slot pool, whose ids each step's
    /// sequences carry.
    pub fn with_state_slots(mut self, num_slots: usize) -> ModelRunner {
        let layout = self.loaded.model.state_layout();
        if !layout.is_empty() {
            // An empty placeholder while the cache moves into `with_state` (no allocation).
            let kv_cache = std::mem::replace(&mut self.kv_cache, KvCacheStorage::new(&[], 0, 1));
            self.kv_cache = kv_cache.with_state(StateCacheStorage::new(layout, num_slots));
        }
        self
    }
}

impl Executor for ModelRunner {
    fn add_request(&mut self, sequence: NewSequence<'_>) -> Result<(), EngineError> {
        sequence.sampling.validate()?;
        let mut sampler = Sampler::new(sequence.sampling.clone(), sequence.prompt_token_ids);
        if let Some(output) = &sequence.sampling.structured_output {
            // Compiled (and cached) already when the server validated the request; a compile
            // here (the cache evicted it, or a caller without the server) that panics inside
            // the grammar engine refuses this request only.
            let grammar = &self.loaded.grammar;
            let matcher = catch_unwind(AssertUnwindSafe(|| grammar.compile(output)))
                .unwrap_or_else(|panic| {
                    tracing::error!(
                        "grammar compilation panicked: {}",
                        panic_text(panic.as_ref())
                    );
                    Err(ModelError::InvalidGrammar(
                        "the grammar could not be compiled".into(),
                    ))
                })?;
            sampler.chain_mut().set_grammar(Box::new(matcher));
        }
        self.sequences.insert(
            sequence.request_id,
            SequenceState {
                sampler,
                prompt_token_ids: sequence.prompt_token_ids.to_vec(),
                output_token_ids: Vec::new(),
                prompt_logprobs: sequence.prompt_logprobs,
                prompt_logprobs_done: 0,
                lora: sequence.lora.cloned(),
            },
        );
        Ok(())
    }

    fn remove_request(&mut self, request_id: RequestId) {
        self.sequences.remove(&request_id);
    }

    fn execute(&mut self, output: &SchedulerOutput) -> Result<StepOutput, EngineError> {
        let block_size = self.kv_cache.block_size();
        let has_state = self.kv_cache.state().num_layers() > 0;
        self.batch.clear();
        self.rows.clear();
        for scheduled in &output.scheduled {
            let query_start = self.batch.num_tokens();
            self.batch.add_sequence_grouped(
                &scheduled.token_ids,
                scheduled.start_position,
                &scheduled.block_tables,
                block_size,
                false,
            )?;
            if has_state {
                let slot = scheduled.state_slot.ok_or_else(|| {
                    EngineError::Executor(format!(
                        "request {} was scheduled without a recurrent-state slot",
                        scheduled.request_id
                    ))
                })?;
                self.batch.state_slots.push(slot);
            }
            if let Some(state) = self.sequences.get(&scheduled.request_id) {
                if let Some(adapter) = &state.lora {
                    self.batch.set_last_sequence_adapter(adapter)?;
                }
                if state.prompt_logprobs.is_some() {
                    // Row at position p predicts the prompt token at p + 1.
                    let last_predicting = state.prompt_token_ids.len().saturating_sub(1);
                    let from = scheduled.start_position.max(state.prompt_logprobs_done);
                    let to =
                        (scheduled.start_position + scheduled.token_ids.len()).min(last_predicting);
                    for position in from..to {
                        let row = query_start + position - scheduled.start_position;
                        self.batch.logits_indices.push(row as u32);
                        self.rows
                            .push(LogitsRow::Prompt(scheduled.request_id, position));
                    }
                }
            }
            if scheduled.samples {
                // Speculative decoding: the row of the last known token and one per draft, so
                // every draft is checked against the logits of the position before it.
                let num_drafts = scheduled.draft_token_ids.len();
                let first = query_start + scheduled.token_ids.len() - 1 - num_drafts;
                self.batch.logits_indices.push(first as u32);
                self.rows.push(LogitsRow::Sample(scheduled.request_id));
                for row in first + 1..=first + num_drafts {
                    self.batch.logits_indices.push(row as u32);
                    self.rows.push(LogitsRow::Verify);
                }
            }
        }
        if self.batch.is_empty() {
            return Ok(StepOutput::default());
        }
        self.loaded.model.forward(
            &self.loaded.pool,
            &self.batch,
            &mut self.kv_cache,
            &mut self.workspace,
            &mut self.logits,
        )?;

        let vocab = self.loaded.config().vocab_size;
        let mut step = StepOutput::default();
        self.sample_rows(output, vocab, &mut step)?;
        for (row_index, row) in self.rows.iter().enumerate() {
            let LogitsRow::Prompt(request_id, position) = *row else {
                continue;
            };
            let logits = self
                .logits
                .get(row_index * vocab..(row_index + 1) * vocab)
                .ok_or_else(|| EngineError::Executor("logits row out of range".into()))?;
            let Some(state) = self.sequences.get_mut(&request_id) else {
                continue;
            };
            let Some(&target) = state.prompt_token_ids.get(position + 1) else {
                continue;
            };
            let (logprob, top) = token_logprobs(logits, target, state.prompt_logprobs.unwrap_or(0));
            let entry = TokenLogprob {
                token_id: target,
                logprob,
                top,
            };
            state.prompt_logprobs_done = position + 1;
            match step.prompt_logprobs.last_mut() {
                Some((id, entries)) if *id == request_id => entries.push(entry),
                _ => step.prompt_logprobs.push((request_id, vec![entry])),
            }
        }
        Ok(step)
    }
}

impl ModelRunner {
    /// Samples every `LogitsRow::Sample` row (and verifies the drafts on the `Verify` rows
    /// after it), sequences in parallel on the forward pass's pool (each sequence owns its
    /// sampler and RNG, so the result does not depend on the split), and appends each
    /// request's emitted tokens to `step` in row order.
    fn sample_rows(
        &mut self,
        output: &SchedulerOutput,
        vocab: usize,
        step: &mut StepOutput,
    ) -> Result<(), EngineError> {
        let drafts: HashMap<RequestId, &[u32]> = output
            .scheduled
            .iter()
            .filter(|s| s.samples)
            .map(|s| (s.request_id, s.draft_token_ids.as_slice()))
            .collect();
        let sample_rows: HashMap<RequestId, usize> = self
            .rows
            .iter()
            .enumerate()
            .filter_map(|(index, row)| match *row {
                LogitsRow::Sample(request_id) => Some((request_id, index)),
                LogitsRow::Verify | LogitsRow::Prompt(..) => None,
            })
            .collect();
        if sample_rows.is_empty() {
            return Ok(());
        }
        if sample_rows.len()
            != self
                .rows
                .iter()
                .filter(|row| matches!(row, LogitsRow::Sample(_)))
                .count()
        {
            return Err(EngineError::Executor(
                "a request is sampled twice in one step".into(),
            ));
        }
        let mut jobs: Vec<Mutex<SampleJob<'_>>> = self
            .sequences
            .iter_mut()
            .filter_map(|(&request_id, state)| {
                sample_rows.get(&request_id).map(|&row_index| {
                    Mutex::new(SampleJob {
                        request_id,
                        row_index,
                        drafts: drafts.get(&request_id).copied().unwrap_or_default(),
                        state,
                        result: None,
                    })
                })
            })
            .collect();
        if jobs.len() != sample_rows.len() {
            return Err(EngineError::Executor(
                "a sampled request has no sampling state".into(),
            ));
        }
        let logits = &self.logits;
        self.loaded.pool.parallel_for(jobs.len(), &|index| {
            let mut job = jobs[index].lock().unwrap_or_else(PoisonError::into_inner);
            // A dependency (the grammar engine) that panics on one request's input fails
            // that request only; the sampler it left half-updated is dropped with it.
            let result = catch_unwind(AssertUnwindSafe(|| job.sample(logits, vocab)))
                .unwrap_or_else(|panic| Err(SampleError::Panic(panic_text(panic.as_ref()))));
            job.result = Some(result);
        });
        jobs.sort_by_key(|job| job.lock().unwrap_or_else(PoisonError::into_inner).row_index);
        for job in jobs {
            let job = job.into_inner().unwrap_or_else(PoisonError::into_inner);
            let request_id = job.request_id;
            let result = job.result.unwrap_or_else(|| {
                Err(SampleError::Engine(EngineError::Executor(
                    "row was not sampled".into(),
                )))
            });
            match result {
                Ok(tokens) => step
                    .sampled
                    .extend(tokens.into_iter().map(|token| (request_id, token))),
                Err(SampleError::Engine(error)) => return Err(error),
                Err(SampleError::Request(error)) => {
                    tracing::warn!("request {request_id} failed while sampling: {error}");
                    step.failed
                        .push((request_id, RequestFailure::of_model_error(&error)));
                }
                Err(SampleError::Panic(message)) => {
                    tracing::error!("request {request_id}: sampling panicked: {message}");
                    step.failed.push((request_id, RequestFailure::Internal));
                }
            }
        }
        Ok(())
    }
}

/// How one sequence's sampling failed: its own sampler (the request fails alone), or the
/// runner's bookkeeping (the engine fails).
enum SampleError {
    Request(ModelError),
    Panic(String),
    Engine(EngineError),
}

/// A panic payload's text, for the log.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// One sequence's sampling work in a step.
struct SampleJob<'a> {
    request_id: RequestId,
    row_index: usize,
    /// Draft tokens to verify on the rows after `row_index`.
    drafts: &'a [u32],
    state: &'a mut SequenceState,
    result: Option<Result<Vec<SampledToken>, SampleError>>,
}

impl SampleJob<'_> {
    /// The emitted run: each draft position in turn, stopping at the first emitted token
    /// that is not the draft (rejection, or the greedy argmax differing) or that stops the
    /// request; after all drafts match, the bonus token of the last row. Each token is
    /// accepted by the chain and appended to the history before the next row, so every
    /// position sees the processors' state of exactly the tokens emitted before it.
    fn sample(&mut self, logits: &[f32], vocab: usize) -> Result<Vec<SampledToken>, SampleError> {
        let state = &mut *self.state;
        let mut tokens = Vec::with_capacity(self.drafts.len() + 1);
        for offset in 0..=self.drafts.len() {
            let row = self.row_index + offset;
            let row_logits = logits.get(row * vocab..(row + 1) * vocab).ok_or_else(|| {
                SampleError::Engine(EngineError::Executor("logits row out of range".into()))
            })?;
            let history = History {
                prompt: &state.prompt_token_ids,
                output: &state.output_token_ids,
            };
            let draft = self.drafts.get(offset).copied();
            let token = match draft {
                Some(draft) => state.sampler.verify(row_logits, &history, draft),
                None => state.sampler.sample(row_logits, &history),
            }
            .map_err(SampleError::Request)?;
            let token_id = token.token_id;
            state.output_token_ids.push(token_id);
            tokens.push(token);
            let stops = state
                .sampler
                .params()
                .all_stop_token_ids
                .contains(&token_id);
            if draft != Some(token_id) || stops {
                break;
            }
        }
        Ok(tokens)
    }
}
