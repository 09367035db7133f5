//! Offline batch generation (vLLM's `LLM.generate`): submit every prompt at once and let
//! continuous batching run them, returning results in input order.

use indicatif::{ProgressBar, ProgressStyle};

use crate::client::EngineClient;
use crate::request::{FinishReason, GenerateRequest, RequestEvent};
use crate::EngineError;

/// One prompt of a batch.
#[derive(Debug, Clone)]
pub struct BatchItem {
    pub request: GenerateRequest,
}

/// The result of one prompt, in the batch's input order.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchResult {
    pub index: usize,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: Option<FinishReason>,
    pub num_prompt_tokens: usize,
    pub num_cached_tokens: usize,
    /// Set when the engine failed this request.
    pub error: Option<String>,
}

/// Runs `items` through the engine with continuous batching. With `progress`, an indicatif
/// bar shows requests done and output tokens per second.
pub fn generate_batch(
    client: &EngineClient,
    items: Vec<BatchItem>,
    progress: bool,
) -> Result<Vec<BatchResult>, EngineError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bar = if progress {
        let bar = ProgressBar::new(items.len() as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{bar:40} {pos}/{len} requests [{elapsed_precise}<{eta_precise}] {msg}",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let started = std::time::Instant::now();
    let results = runtime.block_on(async {
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let total = items.len();
        for (index, item) in items.into_iter().enumerate() {
            let mut stream = client.add_request(item.request)?;
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                let mut result = BatchResult {
                    index,
                    text: String::new(),
                    token_ids: Vec::new(),
                    finish_reason: None,
                    num_prompt_tokens: 0,
                    num_cached_tokens: 0,
                    error: None,
                };
                while let Some(event) = stream.recv().await {
                    match event {
                        RequestEvent::Output(output) => {
                            result.text.push_str(&output.new_text);
                            result.token_ids.extend_from_slice(&output.new_token_ids);
                            result.num_prompt_tokens = output.num_prompt_tokens;
                            result.num_cached_tokens = output.num_cached_tokens;
                            result.finish_reason = output.finish_reason;
                        }
                        RequestEvent::Rejected(message) | RequestEvent::Error(message) => {
                            result.error = Some(message)
                        }
                        RequestEvent::Failed(failure) => {
                            result.error = Some(failure.message().to_string())
                        }
                    }
                }
                if result.finish_reason.is_none() && result.error.is_none() {
                    result.error = Some("the engine stopped before the request finished".into());
                }
                let _ = done_tx.send(result);
            });
        }
        drop(done_tx);
        let mut results: Vec<Option<BatchResult>> = vec![None; total];
        let mut output_tokens = 0usize;
        while let Some(result) = done_rx.recv().await {
            output_tokens += result.token_ids.len();
            let elapsed = started.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "{:.1} output tok/s",
                output_tokens as f64 / elapsed
            ));
            bar.inc(1);
            let index = result.index;
            if let Some(slot) = results.get_mut(index) {
                *slot = Some(result);
            }
        }
        Ok::<_, EngineError>(results.into_iter().flatten().collect::<Vec<_>>())
    })?;
    bar.finish();
    Ok(results)
}
