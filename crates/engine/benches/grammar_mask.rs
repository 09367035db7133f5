//! Criterion bench for the structured-output mask: what one constrained row costs per step on
//! the default model's 49,152-token vocabulary. For each of `tokenmill bench serve`'s built-in
//! JSON schemas, a valid example object is tokenized and replayed through a fresh matcher:
//! every step masks a logits row (llguidance's mask computation plus the row fill) and accepts
//! the example's next token, as the engine does for a constrained row. Throughput is in
//! row-steps; the engine runs a step's rows in parallel on its pool, so this one-thread figure
//! is the work per constrained row per step. Also timed: a cold compile of each schema.
//! Needs the default model (or `TOKENMILL_TEST_MODEL`); run:
//! `cargo bench -p tokenmill-engine --bench grammar_mask`.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};
use tokenmill_engine::grammar_vocabulary;
use tokenmill_gguf::GgufFile;
use tokenmill_models::{
    GrammarCompiler, History, JsonGrammarOptions, LogitsProcessor, StructuredOutput,
};
use tokenmill_text::Tokenizer;

/// One valid instance of each built-in schema, in schema order.
fn examples() -> Vec<Value> {
    vec![
        json!({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com",
               "address": {"city": "London", "zip": "01234"}, "interests": ["maths", "poetry"]}),
        json!({"order_id": 1042, "status": "shipped",
               "lines": [{"sku": "A-100", "quantity": 2, "unit_price": 19.5},
                         {"sku": "C-300", "quantity": 1, "unit_price": 240}], "gift": false}),
        json!({"kind": "click", "payload": {"message": "button pressed twice"}, "retries": 1}),
        json!({"city": "Lyon", "temperature_c": 21.5, "conditions": "sunny",
               "forecast": [{"day": "mon", "high": 24, "low": 13},
                            {"day": "tue", "high": 22, "low": 12}]}),
    ]
}

use tokenmill_test_assets::default_model as model_path;

fn bench_masks(c: &mut Criterion) {
    let path = model_path();
    let Ok(file) = GgufFile::open(&path) else {
        eprintln!(
            "skipped: no model at {} (set TOKENMILL_TEST_MODEL)",
            path.display()
        );
        return;
    };
    let Ok(tokenizer) = Tokenizer::from_gguf(&file) else {
        eprintln!("skipped: {} has no usable tokenizer", path.display());
        return;
    };
    let Ok(mut compiler) = GrammarCompiler::new(&grammar_vocabulary(&tokenizer)) else {
        eprintln!("skipped: the grammar engine refused the vocabulary");
        return;
    };
    compiler.set_json_options(JsonGrammarOptions::default());
    let vocab = tokenizer.vocab_size();
    let mut group = c.benchmark_group("grammar_mask");
    for (index, (schema, example)) in tokenmill_bench::builtin_schemas()
        .iter()
        .zip(examples())
        .enumerate()
    {
        assert!(jsonschema::is_valid(schema, &example), "example {index}");
        let output = StructuredOutput::JsonSchema(schema.to_string());
        let tokens = tokenizer
            .encode(&example.to_string(), false)
            .unwrap_or_default();
        let name = schema["title"]
            .as_str()
            .unwrap_or("schema")
            .replace(' ', "_");
        group.throughput(Throughput::Elements(tokens.len() as u64));
        group.bench_function(format!("steps/{name}"), |b| {
            b.iter_batched(
                || (compiler.compile(&output).ok(), vec![0.0f32; vocab]),
                |(matcher, mut row)| {
                    let Some(mut matcher) = matcher else {
                        return 0;
                    };
                    let history = History::default();
                    let mut steps = 0;
                    for &token in &tokens {
                        if matcher.apply(&mut row, &history).is_err()
                            || matcher.accept(token).is_err()
                        {
                            break;
                        }
                        steps += 1;
                    }
                    assert_eq!(steps, tokens.len(), "the example left the grammar");
                    steps
                },
                BatchSize::SmallInput,
            )
        });
        group.throughput(Throughput::Elements(1));
        let mut serial = 0u64;
        group.bench_function(format!("cold_compile/{name}"), |b| {
            b.iter(|| {
                // A new optional property makes the text new, so the compile cache misses.
                serial += 1;
                let mut cold = schema.clone();
                cold["properties"][format!("note_{serial}")] = json!({"type": "string"});
                compiler
                    .compile(&StructuredOutput::JsonSchema(cold.to_string()))
                    .is_ok()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).without_plots();
    targets = bench_masks
}
criterion_main!(benches);
