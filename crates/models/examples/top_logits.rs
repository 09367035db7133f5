//! Prints the most likely next tokens after a prompt of token ids: a debugging aid for
//! comparing the forward pass with other engines.
//!
//! `cargo run --release -p tokenmill-models --example top_logits -- 504,3575,282 [--f32]`

use tokenmill_models::{
    load_model, resolve_model, BatchInput, KvCacheStorage, LoadOptions, ThreadPool, Workspace,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let ids: Vec<u32> = args
        .next()
        .ok_or("usage: top_logits ID,ID,... [--f32]")?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let dequantize_to_f32 = args.any(|arg| arg == "--f32");
    let source = resolve_model(std::env::var("TOKENMILL_MODEL").ok().as_deref())?;
    let model = load_model(
        &source,
        &LoadOptions {
            dequantize_to_f32,
            ..LoadOptions::default()
        },
    )?;
    let block_size = 16;
    let blocks: Vec<u32> = (0..ids.len().div_ceil(block_size) as u32).collect();
    let mut kv = KvCacheStorage::new(model.kv_layout(), blocks.len(), block_size);
    let mut batch = BatchInput::default();
    batch.add_sequence(&ids, 0, &blocks, block_size, true)?;
    let mut logits = Vec::new();
    let pool = ThreadPool::default();
    model.forward(&pool, &batch, &mut kv, &mut Workspace::new(), &mut logits)?;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    for &id in order.iter().take(6) {
        println!("{id} {:.4}", logits[id]);
    }
    Ok(())
}
