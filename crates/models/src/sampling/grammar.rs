//! Structured outputs: a grammar (JSON schema, regex, choice, Lark or GBNF) as the logits
//! chain's first processor, on llguidance.
//!
//! [`GrammarCompiler`] is built once per tokenizer (the token trie over every token's bytes,
//! special tokens behind llguidance's marker byte so free text never produces them) and shared:
//! the server compiles a request's grammar with it to answer 400 before queuing, the executor
//! compiles it again in `add_request` and hits the cache. A compiled grammar is a fresh
//! llguidance `Matcher`, cached by its [`StructuredOutput`] (kind and text) and deep-cloned per
//! request. [`GrammarMatcher`] is the per-request [`LogitsProcessor`]: `apply` sets every token
//! the grammar forbids to `-inf`, `accept` advances it. EOS is allowed only where the grammar
//! may end, and once it has ended only EOS is, so the request stops with reason `stop`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use super::gbnf::gbnf_to_lark;
use super::processors::{History, LogitsProcessor};
use super::schema_rewrite::rewrite_property_names;
use crate::error::{ModelError, Result};

/// Compiled grammars kept for reuse (a repeated schema does not recompile). The cache is
/// bounded in entries, and each entry in size by the limits below, so distinct grammars
/// cannot grow it without bound.
const CACHE_CAPACITY: usize = 64;

/// Most alternatives a `choice` may list (each becomes a grammar branch; a 100,000-way
/// choice compiles for tens of seconds).
pub const MAX_CHOICES: usize = 1024;

/// Most rule definitions a Lark or GBNF grammar may hold.
pub const MAX_GRAMMAR_RULES: usize = 512;

/// Most `$ref`s a JSON schema may hold (chained definitions recurse in the compiler).
pub const MAX_SCHEMA_REFS: usize = 256;

/// Deepest bracket nesting (`( [ {`) of a grammar or regex, and deepest JSON nesting of a
/// schema.
pub const MAX_NESTING_DEPTH: usize = 64;

/// The stack grammar compilation runs on: llguidance's compiler recurses over the grammar,
/// and within the limits above this is ample (a default 2 MiB thread stack is not; the pages
/// are only reserved until touched).
pub const GRAMMAR_COMPILE_STACK_BYTES: usize = 256 << 20;

/// What a request's output must match (vLLM's structured-outputs kinds).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StructuredOutput {
    /// A JSON schema, as JSON text.
    JsonSchema(String),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression the whole output matches (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect, or in GBNF (`root ::= ...`).
    Grammar(String),
}

/// JSON-schema compilation options fixed for a server (vLLM's `--structured-outputs-config`),
/// applied to every JSON schema and JSON object constraint it compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonGrammarOptions {
    /// Whitespace allowed between JSON tokens (off with `disable_any_whitespace`: compact
    /// JSON). A request's own `whitespace_pattern` still wins.
    pub any_whitespace: bool,
    /// Every object schema that has `properties` (or `patternProperties`) and does not say
    /// otherwise gets `additionalProperties: false` (`disable_additional_properties`).
    pub no_additional_properties: bool,
}

impl Default for JsonGrammarOptions {
    fn default() -> Self {
        JsonGrammarOptions {
            any_whitespace: true,
            no_additional_properties: false,
        }
    }
}

impl JsonGrammarOptions {
    /// `schema` with these options written in (after `propertyNames` is rewritten, see
    /// `schema_rewrite.rs`): `additionalProperties` where they are
    /// implied, and llguidance's `x-guidance` compile options (keys the schema already sets
    /// are kept).
    fn apply(&self, mut schema: serde_json::Value) -> serde_json::Value {
        rewrite_property_names(&mut schema);
        if self.no_additional_properties {
            close_objects(&mut schema);
        }
        if !self.any_whitespace {
            if let serde_json::Value::Object(object) = &mut schema {
                let guidance = object
                    .entry("x-guidance")
                    .or_insert_with(|| serde_json::json!({}));
                if let serde_json::Value::Object(guidance) = guidance {
                    guidance
                        .entry("whitespace_flexible")
                        .or_insert(serde_json::Value::Bool(false));
                }
            }
        }
        schema
    }
}

/// vLLM's `disable_additional_properties` walk: every (sub)schema with `properties` or
/// `patternProperties` and no `additionalProperties` is closed.
fn close_objects(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(object) => {
            for child in object.values_mut() {
                close_objects(child);
            }
            let has_properties =
                object.contains_key("properties") || object.contains_key("patternProperties");
            if has_properties && !object.contains_key("additionalProperties") {
                object.insert(
                    "additionalProperties".into(),
                    serde_json::Value::Bool(false),
                );
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

impl StructuredOutput {
    /// Refuses a constraint over the size limits above, naming the limit.
    pub fn check_limits(&self) -> std::result::Result<(), String> {
        match self {
            StructuredOutput::Choice(choices) if choices.len() > MAX_CHOICES => Err(format!(
                "{} choices; at most {MAX_CHOICES} are allowed (limit MAX_CHOICES)",
                choices.len()
            )),
            StructuredOutput::Choice(_) | StructuredOutput::JsonObject => Ok(()),
            StructuredOutput::Regex(regex) => check_nesting(regex),
            StructuredOutput::Grammar(text) => {
                let rules = text.lines().filter(|line| is_rule_definition(line)).count();
                if rules > MAX_GRAMMAR_RULES {
                    return Err(format!(
                        "{rules} rules; at most {MAX_GRAMMAR_RULES} are allowed \
                         (limit MAX_GRAMMAR_RULES)"
                    ));
                }
                check_nesting(text)
            }
            StructuredOutput::JsonSchema(schema) => {
                let refs = schema.matches("\"$ref\"").count();
                if refs > MAX_SCHEMA_REFS {
                    return Err(format!(
                        "{refs} $refs; at most {MAX_SCHEMA_REFS} are allowed \
                         (limit MAX_SCHEMA_REFS)"
                    ));
                }
                check_nesting(schema)
            }
        }
    }

    /// llguidance's form of the constraint; a malformed schema or grammar is an error here or
    /// when the parser is built.
    fn to_grammar(
        &self,
        options: &JsonGrammarOptions,
    ) -> std::result::Result<TopLevelGrammar, String> {
        Ok(match self {
            StructuredOutput::JsonSchema(schema) => TopLevelGrammar::from_json_schema(
                options
                    .apply(serde_json::from_str(schema).map_err(|e| format!("invalid JSON: {e}"))?),
            ),
            StructuredOutput::JsonObject => TopLevelGrammar::from_json_schema(
                options.apply(serde_json::json!({"type": "object"})),
            ),
            StructuredOutput::Regex(regex) => TopLevelGrammar::from_regex(regex),
            StructuredOutput::Choice(choices) => {
                if choices.is_empty() {
                    return Err("the list of choices is empty".into());
                }
                // JSON string syntax is Lark's string literal syntax.
                let alternatives: Vec<String> = choices
                    .iter()
                    .map(|choice| serde_json::Value::from(choice.as_str()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            StructuredOutput::Grammar(text) if is_gbnf(text) => {
                TopLevelGrammar::from_lark(gbnf_to_lark(text)?)
            }
            StructuredOutput::Grammar(text) => TopLevelGrammar::from_lark(text.clone()),
        })
    }
}

/// A line that defines a Lark rule or terminal (`name:`, `?name:`, `NAME.2:`) or a GBNF rule
/// (`name ::=`).
fn is_rule_definition(line: &str) -> bool {
    let line = line.trim_start().trim_start_matches(['?', '!']);
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .unwrap_or(line.len());
    name_end > 0 && {
        let rest = line[name_end..].trim_start();
        rest.starts_with(':') || rest.starts_with("::=")
    }
}

/// Refuses bracket nesting deeper than [`MAX_NESTING_DEPTH`] (the parsers recurse on it).
/// Brackets inside quoted literals count too: a conservative bound, not a parse.
fn check_nesting(text: &str) -> std::result::Result<(), String> {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '(' | '[' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_NESTING_DEPTH {
        return Err(format!(
            "nesting {deepest} deep; at most {MAX_NESTING_DEPTH} levels are allowed \
             (limit MAX_NESTING_DEPTH)"
        ));
    }
    Ok(())
}

/// GBNF defines rules with `name ::=` at the start of a line; Lark with `name:`.
fn is_gbnf(text: &str) -> bool {
    text.lines().any(|line| {
        line.split_once("::=").is_some_and(|(name, _)| {
            let name = name.trim();
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
    })
}

/// A tokenizer's vocabulary as the grammar engine needs it, built by the caller (which owns
/// the tokenizer) once at start-up.
#[derive(Debug, Clone, Default)]
pub struct GrammarVocabulary {
    /// Per token id: the bytes it decodes to on its own (empty for unused ids).
    pub pieces: Vec<Vec<u8>>,
    /// Per token id: a control token, never produced inside free text.
    pub special: Vec<bool>,
    /// Every id that ends generation; the first is the primary EOS.
    pub eos_token_ids: Vec<u32>,
}

/// The token environment llguidance computes masks over: the trie, and a greedy tokenizer
/// over it (tokenmill does not let the grammar force tokens, so tokenization is only used
/// for literals inside grammars).
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Compiles [`StructuredOutput`]s against one tokenizer, caching the results. Shared (`Arc`)
/// between the server's validation and the executor.
pub struct GrammarCompiler {
    factory: ParserFactory,
    json_options: JsonGrammarOptions,
    cache: Mutex<GrammarCache>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .finish_non_exhaustive()
    }
}

/// A small LRU of compiled grammars: each entry remembers when it was last used.
#[derive(Default)]
struct GrammarCache {
    entries: HashMap<StructuredOutput, (Matcher, u64)>,
    clock: u64,
}

impl GrammarCache {
    fn get(&mut self, key: &StructuredOutput) -> Option<Matcher> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(matcher, used)| {
            *used = clock;
            matcher.deep_clone()
        })
    }

    fn insert(&mut self, key: StructuredOutput, matcher: &Matcher) {
        if self.entries.len() >= CACHE_CAPACITY {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.clock += 1;
        self.entries.insert(key, (matcher.deep_clone(), self.clock));
    }
}

fn grammar_error(message: impl std::fmt::Display) -> ModelError {
    ModelError::InvalidGrammar(message.to_string())
}

impl GrammarCompiler {
    /// Builds the token trie and llguidance's parser factory (the expensive part, once).
    pub fn new(vocabulary: &GrammarVocabulary) -> Result<GrammarCompiler> {
        let Some(&eos) = vocabulary.eos_token_ids.first() else {
            return Err(grammar_error("the tokenizer has no EOS token"));
        };
        let words: Vec<Vec<u8>> = vocabulary
            .pieces
            .iter()
            .enumerate()
            .map(|(id, piece)| {
                if vocabulary.special.get(id).copied().unwrap_or(false) {
                    // The marker byte keeps control tokens out of every text lexeme.
                    let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    word.extend_from_slice(piece);
                    word
                } else {
                    piece.clone()
                }
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&vocabulary.eos_token_ids);
        let env: TokEnv = Arc::new(TrieEnv { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(grammar_error)?;
        factory.quiet();
        // Errors name the problem, not the parser's state dump (they reach clients as 400s).
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarCompiler {
            factory,
            json_options: JsonGrammarOptions::default(),
            cache: Mutex::new(GrammarCache::default()),
        })
    }

    /// Compiles JSON constraints with these options from now on (grammars cached under the
    /// old ones are dropped).
    pub fn set_json_options(&mut self, options: JsonGrammarOptions) {
        self.json_options = options;
        self.cache = Mutex::new(GrammarCache::default());
    }

    pub fn json_options(&self) -> JsonGrammarOptions {
        self.json_options
    }

    /// A fresh per-request matcher for `output`; an invalid or unsupported schema, regex or
    /// grammar is [`ModelError::InvalidGrammar`] with llguidance's message.
    pub fn compile(&self, output: &StructuredOutput) -> Result<GrammarMatcher> {
        if let Some(matcher) = self.lock().get(output) {
            return Ok(GrammarMatcher::new(matcher));
        }
        output.check_limits().map_err(grammar_error)?;
        // On a thread of its own with a stack the compiler's recursion cannot exhaust,
        // whatever thread asked (an async runtime's blocking pool, the engine loop).
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(GRAMMAR_COMPILE_STACK_BYTES)
                .spawn_scoped(scope, || self.compile_uncached(output))
                .map_err(|error| {
                    grammar_error(format!("cannot start the compile thread: {error}"))
                })?
                .join()
                .unwrap_or_else(|_| Err(grammar_error("the grammar could not be compiled")))
        })
    }

    fn compile_uncached(&self, output: &StructuredOutput) -> Result<GrammarMatcher> {
        let grammar = output
            .to_grammar(&self.json_options)
            .map_err(grammar_error)?;
        let parser = self.factory.create_parser(grammar).map_err(grammar_error)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(grammar_error(error));
        }
        // A grammar no text can satisfy (a regex that matches nothing, a rule that never
        // terminates, a schema that refers only to itself) has no first token: its first mask
        // fails. Found here it is the client's 400, not a failure in the middle of decoding.
        let mut probe = matcher.deep_clone();
        match probe.compute_mask() {
            Ok(mask) if !mask.is_zero() => {}
            Ok(_) => {
                return Err(grammar_error(
                    "no text matches it (it allows no first token)",
                ))
            }
            Err(error) => {
                // The matcher's own text ("NoExtensionBias", its markup) is for the log.
                tracing::debug!("first mask of a structured output failed: {error}");
                return Err(grammar_error(
                    "no text matches it (it allows no first token)",
                ));
            }
        }
        self.lock().insert(output.clone(), &matcher);
        Ok(GrammarMatcher::new(matcher))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GrammarCache> {
        // A panic while holding the lock leaves only a cache behind; keep using it.
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One request's grammar state: the logits chain's structured-outputs slot.
pub struct GrammarMatcher {
    matcher: Matcher,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl GrammarMatcher {
    fn new(matcher: Matcher) -> GrammarMatcher {
        GrammarMatcher { matcher }
    }

    /// The tokens allowed next, as a sorted list (for tests and diagnostics).
    pub fn allowed_tokens(&mut self) -> Result<Vec<u32>> {
        Ok(self
            .matcher
            .compute_mask_or_eos()
            .map_err(grammar_error)?
            .to_list())
    }

    /// The grammar has ended: only EOS may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

impl LogitsProcessor for GrammarMatcher {
    fn apply(&mut self, logits: &mut [f32], _: &History<'_>) -> Result<()> {
        let mask = self.matcher.compute_mask_or_eos().map_err(grammar_error)?;
        let known = mask.len().min(logits.len());
        let (inside, beyond) = logits.split_at_mut(known);
        for (id, logit) in inside.iter_mut().enumerate() {
            if !mask.get(id) {
                *logit = f32::NEG_INFINITY;
            }
        }
        // Ids the tokenizer does not know (padding rows of the head) are never text.
        beyond.fill(f32::NEG_INFINITY);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            // EOS after the grammar ended (or a token `ignore_eos` let through): nothing to track.
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(grammar_error)
    }
}

#[cfg(test)]
mod tests {
    //! Masks on a hand-made vocabulary, checked by hand.

    use super::*;

    const EOS: u32 = 0;

    /// `<eos>` (a control token), then text pieces.
    fn compiler() -> GrammarCompiler {
        let pieces = [
            "<eos>", "y", "e", "s", "yes", "n", "no", "o", "ye", " ", "{", "}", "\"a\"",
        ];
        GrammarCompiler::new(&GrammarVocabulary {
            pieces: pieces.iter().map(|p| p.as_bytes().to_vec()).collect(),
            special: pieces.iter().map(|p| *p == "<eos>").collect(),
            eos_token_ids: vec![EOS],
        })
        .unwrap()
    }

    fn id(piece: &str) -> u32 {
        let pieces = [
            "<eos>", "y", "e", "s", "yes", "n", "no", "o", "ye", " ", "{", "}", "\"a\"",
        ];
        pieces.iter().position(|p| *p == piece).unwrap() as u32
    }

    fn ids(pieces: &[&str]) -> Vec<u32> {
        let mut ids: Vec<u32> = pieces.iter().map(|p| id(p)).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn choice_masks_allow_exactly_the_valid_continuations() {
        let compiler = compiler();
        let choice = StructuredOutput::Choice(vec!["yes".into(), "no".into()]);
        let mut matcher = compiler.compile(&choice).unwrap();
        assert_eq!(
            matcher.allowed_tokens().unwrap(),
            ids(&["y", "yes", "n", "no", "ye"])
        );
        matcher.accept(id("ye")).unwrap();
        assert_eq!(matcher.allowed_tokens().unwrap(), ids(&["s"]));
        matcher.accept(id("s")).unwrap();
        // Complete: only EOS, and the matcher says it has ended.
        assert_eq!(matcher.allowed_tokens().unwrap(), vec![EOS]);
        assert!(matcher.is_finished());
        matcher.accept(EOS).unwrap();
    }

    #[test]
    fn disable_any_whitespace_leaves_no_room_between_json_tokens() {
        let object = StructuredOutput::JsonObject;
        let mut flexible = compiler().compile(&object).unwrap();
        flexible.accept(id("{")).unwrap();
        assert!(flexible.allowed_tokens().unwrap().contains(&id(" ")));
        let mut compact = compiler();
        compact.set_json_options(JsonGrammarOptions {
            any_whitespace: false,
            ..JsonGrammarOptions::default()
        });
        let mut matcher = compact.compile(&object).unwrap();
        assert!(!matcher.allowed_tokens().unwrap().contains(&id(" ")));
        matcher.accept(id("{")).unwrap();
        assert_eq!(matcher.allowed_tokens().unwrap(), ids(&["}", "\"a\""]));
        // A request's own whitespace pattern still wins over the server's option.
        let pattern = StructuredOutput::JsonSchema(
            r#"{"type":"object","x-guidance":{"whitespace_pattern":" "}}"#.into(),
        );
        let mut matcher = compact.compile(&pattern).unwrap();
        matcher.accept(id("{")).unwrap();
        assert!(matcher.allowed_tokens().unwrap().contains(&id(" ")));
    }

    #[test]
    fn disable_additional_properties_closes_every_object_that_lists_properties() {
        let options = JsonGrammarOptions {
            no_additional_properties: true,
            ..JsonGrammarOptions::default()
        };
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
            "$defs": {"open": {"properties": {}, "additionalProperties": true}},
            "anyOf": [{"patternProperties": {"^x": {}}}, {"type": "string"}],
        });
        let closed = options.apply(schema);
        assert_eq!(closed["additionalProperties"], false);
        assert_eq!(closed["properties"]["a"]["additionalProperties"], false);
        assert_eq!(closed["$defs"]["open"]["additionalProperties"], true);
        assert_eq!(closed["anyOf"][0]["additionalProperties"], false);
        assert!(closed["anyOf"][1].get("additionalProperties").is_none());
        // The open default compiles a schema unchanged.
        let schema = serde_json::json!({"properties": {}});
        assert_eq!(JsonGrammarOptions::default().apply(schema.clone()), schema);
    }

    #[test]
    fn apply_masks_the_row_and_eos_waits_for_the_end() {
        let compiler = compiler();
        let mut matcher = compiler
            .compile(&StructuredOutput::Regex("(yes)+".into()))
            .unwrap();
        // A row longer than the vocabulary: the extra ids are masked too.
        let mut logits = vec![1.0; 15];
        matcher.apply(&mut logits, &History::default()).unwrap();
        let allowed: Vec<u32> = (0..15).filter(|&i| logits[i as usize] == 1.0).collect();
        assert_eq!(allowed, ids(&["y", "yes", "ye"]));
        matcher.accept(id("yes")).unwrap();
        // "yes" may end here or repeat: EOS and the start of another "yes".
        assert_eq!(
            matcher.allowed_tokens().unwrap(),
            ids(&["<eos>", "y", "yes", "ye"])
        );
    }

    #[test]
    fn control_tokens_never_appear_in_free_text() {
        let compiler = compiler();
        let mut matcher = compiler
            .compile(&StructuredOutput::Regex("(?s:.)*".into()))
            .unwrap();
        let allowed = matcher.allowed_tokens().unwrap();
        // Everything is text except `<eos>`, which is allowed only as the end (the regex may
        // end here), never as the text "<eos>".
        assert_eq!(allowed.len(), 13);
        matcher.accept(id("y")).unwrap();
        assert!(matcher.allowed_tokens().unwrap().contains(&EOS));
    }

    #[test]
    fn cache_returns_fresh_matchers_and_bad_input_is_refused() {
        let compiler = compiler();
        let json = StructuredOutput::JsonObject;
        let mut first = compiler.compile(&json).unwrap();
        first.accept(id("{")).unwrap();
        // The cached grammar is not the first request's state.
        let mut second = compiler.compile(&json).unwrap();
        assert!(second.allowed_tokens().unwrap().contains(&id("{")));
        assert!(!second.allowed_tokens().unwrap().contains(&id("}")));
        for bad in [
            StructuredOutput::JsonSchema("{\"type\": \"nonsense\"}".into()),
            StructuredOutput::JsonSchema("not json".into()),
            StructuredOutput::Regex("(".into()),
            StructuredOutput::Grammar("start: undefined_rule".into()),
            StructuredOutput::Grammar("root ::= \"a".into()),
            StructuredOutput::Choice(Vec::new()),
        ] {
            let error = compiler.compile(&bad).unwrap_err();
            assert!(
                matches!(error, ModelError::InvalidGrammar(_)),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn property_names_compile_as_their_equivalent_and_a_key_pattern_holds() {
        let compiler = compiler();
        let keys = |pattern: &str| {
            let schema =
                serde_json::json!({"type": "object", "propertyNames": {"pattern": pattern}});
            let mut matcher = compiler
                .compile(&StructuredOutput::JsonSchema(schema.to_string()))
                .unwrap();
            matcher.accept(id("{")).unwrap();
            matcher.allowed_tokens().unwrap()
        };
        assert!(keys("^a$").contains(&id("\"a\"")));
        assert!(!keys("^b$").contains(&id("\"a\"")));
        let record =
            r#"{"type":"object","propertyNames":{"type":"string"},"additionalProperties":{}}"#;
        compiler
            .compile(&StructuredOutput::JsonSchema(record.into()))
            .unwrap();
        // A key constraint with no equivalent is refused, naming the keyword.
        let error = compiler
            .compile(&StructuredOutput::JsonSchema(
                r#"{"type":"object","propertyNames":{"maxLength":2}}"#.into(),
            ))
            .unwrap_err();
        assert!(error.to_string().contains("propertyNames"), "{error}");
    }

    #[test]
    fn grammars_no_text_satisfies_are_refused_when_compiled() {
        let compiler = compiler();
        for empty in [
            StructuredOutput::Regex(r"[^\s\S]".into()),
            StructuredOutput::Grammar("start: start \"a\"".into()),
            StructuredOutput::JsonSchema(r##"{"$ref": "#"}"##.into()),
        ] {
            let error = compiler.compile(&empty).unwrap_err();
            assert!(
                matches!(error, ModelError::InvalidGrammar(_)),
                "{empty:?}: {error}"
            );
        }
        // A grammar whose only text is the empty string still compiles: EOS is its token.
        let mut matcher = compiler
            .compile(&StructuredOutput::Regex(String::new()))
            .unwrap();
        assert_eq!(matcher.allowed_tokens().unwrap(), vec![EOS]);
    }

    /// A schema whose `$defs` chain `n` deep (`d0` → `d1` → ... → a string).
    fn chained_schema(n: usize) -> String {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{n}"), serde_json::json!({"type": "string"}));
        serde_json::json!({"$ref": "#/$defs/d0", "$defs": defs}).to_string()
    }

    /// A Lark grammar of `n` rules, each the next one's prefix.
    fn chained_rules(n: usize) -> String {
        let mut grammar = String::from("start: r0\n");
        for i in 0..n {
            grammar.push_str(&format!("r{i}: \"y\" r{}\n", i + 1));
        }
        grammar.push_str(&format!("r{n}: \"n\"\n"));
        grammar
    }

    #[test]
    fn oversized_grammars_are_refused_naming_the_limit_in_bounded_time() {
        let compiler = compiler();
        let started = std::time::Instant::now();
        let choices: Vec<String> = (0..100_000).map(|i| format!("c{i}")).collect();
        for (output, limit) in [
            (StructuredOutput::Choice(choices), "MAX_CHOICES"),
            (
                StructuredOutput::Grammar(chained_rules(1000)),
                "MAX_GRAMMAR_RULES",
            ),
            (
                StructuredOutput::JsonSchema(chained_schema(300)),
                "MAX_SCHEMA_REFS",
            ),
            (
                StructuredOutput::Regex(format!("{}a{}", "(".repeat(200), ")".repeat(200))),
                "MAX_NESTING_DEPTH",
            ),
        ] {
            let error = compiler.compile(&output).unwrap_err().to_string();
            assert!(error.contains(limit), "{error}");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn deep_grammars_within_the_limits_compile_on_the_compile_threads_stack() {
        let compiler = compiler();
        compiler
            .compile(&StructuredOutput::JsonSchema(chained_schema(250)))
            .unwrap();
        compiler
            .compile(&StructuredOutput::Grammar(chained_rules(500)))
            .unwrap();
    }

    #[test]
    fn raw_logprobs_see_the_grammar_mask_as_in_vllm() {
        let compiler = compiler();
        let params = crate::SamplingParams {
            logprobs: Some(2),
            ..crate::SamplingParams::greedy()
        };
        let mut sampler = crate::Sampler::new(params, &[]);
        let choice = StructuredOutput::Choice(vec!["yes".into(), "no".into()]);
        sampler
            .chain_mut()
            .set_grammar(Box::new(compiler.compile(&choice).unwrap()));
        // Flat logits: the five allowed tokens share the mass.
        let token = sampler.sample(&[0.0; 13], &History::default()).unwrap();
        assert_eq!(token.token_id, id("y"));
        let expected = -(5.0f32).ln();
        assert!(
            (token.logprob.unwrap() - expected).abs() < 1e-5,
            "{token:?}"
        );
        assert!(token
            .top_logprobs
            .iter()
            .all(|&(id, logprob)| [1, 4].contains(&id) && (logprob - expected).abs() < 1e-5));
    }

    #[test]
    fn an_ended_grammar_stops_even_under_min_tokens() {
        let compiler = compiler();
        let params = crate::SamplingParams {
            min_tokens: 10,
            all_stop_token_ids: vec![EOS],
            ..crate::SamplingParams::greedy()
        };
        let mut sampler = crate::Sampler::new(params, &[]);
        let choice = StructuredOutput::Choice(vec!["yes".into()]);
        sampler
            .chain_mut()
            .set_grammar(Box::new(compiler.compile(&choice).unwrap()));
        let mut logits = [0.0; 13];
        logits[id("yes") as usize] = 1.0;
        let first = sampler.sample(&logits, &History::default()).unwrap();
        assert_eq!(first.token_id, id("yes"));
        let history = History {
            prompt: &[],
            output: &[first.token_id],
        };
        assert_eq!(sampler.sample(&logits, &history).unwrap().token_id, EOS);
    }

    #[test]
    fn lark_with_a_gbnf_looking_literal_stays_lark() {
        assert!(is_gbnf("root ::= \"a\"\n"));
        assert!(is_gbnf("# c\n  my-rule ::= x\n"));
        assert!(!is_gbnf("start: \"a ::= b\""));
    }

    #[test]
    fn gbnf_grammars_compile_and_constrain() {
        let compiler = compiler();
        let mut matcher = compiler
            .compile(&StructuredOutput::Grammar(
                "root ::= \"n\" tail\ntail ::= \"o\"".into(),
            ))
            .unwrap();
        assert_eq!(matcher.allowed_tokens().unwrap(), ids(&["n", "no"]));
    }
}
