//! Synthetic prompts: `random` (distinct random-token prompts of exact lengths) and
//! `prefix_repetition` (a few shared random prefixes, each followed by random suffixes).

use futures::stream::{self, StreamExt, TryStreamExt};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use super::request_rng;
use crate::client::RequestInput;
use crate::corpus;
use crate::error::BenchError;
use crate::tokenize::PromptTokenizer;

/// Tokenize/detokenize round trips in flight while building prompts with a server tokenizer.
const BUILD_CONCURRENCY: usize = 16;
/// vLLM's retry budget for matching the target length after a decode/encode round trip.
const MAX_LENGTH_RETRIES: usize = 10;

#[derive(Debug, Clone)]
pub struct RandomConfig {
    pub num_requests: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub range_ratio: f64,
    pub prefix_len: usize,
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct PrefixRepetitionConfig {
    pub num_requests: usize,
    pub prefix_len: usize,
    pub suffix_len: usize,
    pub num_prefixes: usize,
    pub output_len: usize,
    pub seed: u64,
}

/// Random tokens, then decode → encode → pad or truncate until the text re-encodes to exactly
/// `target` tokens (vLLM's `gen_prompt_decode_to_target_len`). Returns the text, its tokens and
/// the remaining mismatch (non-zero only when the retries ran out).
pub async fn decode_to_target_len(
    tokenizer: &PromptTokenizer,
    mut tokens: Vec<u32>,
    target: usize,
    rng: &mut StdRng,
) -> Result<(String, Vec<u32>, i64), BenchError> {
    let allowed = tokenizer.allowed_tokens();
    let mut retries_left = MAX_LENGTH_RETRIES;
    loop {
        let prompt = tokenizer.decode(&tokens).await?;
        tokens = tokenizer.encode(&prompt).await?;
        if retries_left == 0 || tokens.len() == target {
            let mismatch = tokens.len() as i64 - target as i64;
            return Ok((prompt, tokens, mismatch));
        }
        if tokens.len() < target {
            let missing = target - tokens.len();
            tokens.extend((0..missing).filter_map(|_| allowed.choose(rng).copied()));
        } else {
            tokens.truncate(target);
        }
        retries_left -= 1;
    }
}

fn random_tokens(allowed: &[u32], count: usize, rng: &mut StdRng) -> Vec<u32> {
    (0..count)
        .filter_map(|_| allowed.choose(rng).copied())
        .collect()
}

fn random_words(count: usize, rng: &mut StdRng) -> Vec<&'static str> {
    let words = corpus::words();
    (0..count)
        .filter_map(|_| words.choose(rng).copied())
        .collect()
}

fn warn_mismatch(total_mismatch: i64) {
    if total_mismatch != 0 {
        let sign = if total_mismatch > 0 { "more" } else { "fewer" };
        println!(
            "WARNING: across all generated prompts, there were {} {sign} tokens than expected \
             after decoding and re-encoding.",
            total_mismatch.abs()
        );
    }
}

/// vLLM's `random` dataset. Lengths are drawn uniformly from
/// [⌊len·(1−r)⌋, ⌈len·(1+r)⌉]; the input range excludes the tokens the server adds (BOS).
///
/// Unlike vLLM, whose prompts are `(offset + index + j) % vocab` runs (two requests whose
/// `offset + index` coincide get the same prompt, about ten pairs among 1000 requests over a
/// 49k vocabulary), every prompt here is independent random tokens from its own seeded
/// stream, so no two requests share a cacheable prefix unless `prefix_len` asks for one.
pub async fn random_dataset(
    tokenizer: &PromptTokenizer,
    config: &RandomConfig,
) -> Result<Vec<RequestInput>, BenchError> {
    let real_input_len = config
        .input_len
        .saturating_sub(tokenizer.num_special_tokens());
    let ratio = config.range_ratio;
    let input_low = (real_input_len as f64 * (1.0 - ratio)).floor() as usize;
    let input_high = (real_input_len as f64 * (1.0 + ratio)).ceil() as usize;
    let output_low = ((config.output_len as f64 * (1.0 - ratio)).floor() as usize).max(1);
    let output_high = ((config.output_len as f64 * (1.0 + ratio)).ceil() as usize).max(1);
    if config.prefix_len + input_low < 1 {
        return Err(BenchError::InvalidArgument(format!(
            "--random-input-len is too small: with {} special tokens and --random-range-ratio \
             {ratio} the shortest prompt would have no tokens",
            tokenizer.num_special_tokens()
        )));
    }
    let mut rng = StdRng::seed_from_u64(config.seed);
    let input_lens: Vec<usize> = (0..config.num_requests)
        .map(|_| rng.random_range(input_low..=input_high))
        .collect();
    let output_lens: Vec<usize> = (0..config.num_requests)
        .map(|_| rng.random_range(output_low..=output_high))
        .collect();

    if !tokenizer.is_exact() {
        let prefix = random_words(config.prefix_len, &mut rng);
        return Ok((0..config.num_requests)
            .map(|index| {
                let mut request_rng = request_rng(config.seed, index as u64);
                let mut words = prefix.clone();
                words.extend(random_words(input_lens[index], &mut request_rng));
                RequestInput {
                    prompt: words.join(" "),
                    prompt_len: config.prefix_len + input_lens[index],
                    output_len: output_lens[index],
                    json_schema: None,
                }
            })
            .collect());
    }

    let prefix = random_tokens(tokenizer.allowed_tokens(), config.prefix_len, &mut rng);
    let built: Vec<(RequestInput, i64)> = stream::iter(0..config.num_requests)
        .map(|index| {
            let prefix = prefix.clone();
            let (input_len, output_len) = (input_lens[index], output_lens[index]);
            async move {
                let mut request_rng = request_rng(config.seed, index as u64);
                let mut tokens = prefix;
                tokens.extend(random_tokens(
                    tokenizer.allowed_tokens(),
                    input_len,
                    &mut request_rng,
                ));
                let target = config.prefix_len + input_len;
                let (prompt, tokens, mismatch) =
                    decode_to_target_len(tokenizer, tokens, target, &mut request_rng).await?;
                let request = RequestInput {
                    prompt,
                    prompt_len: tokens.len() + tokenizer.num_special_tokens(),
                    output_len,
                    json_schema: None,
                };
                Ok::<_, BenchError>((request, mismatch))
            }
        })
        .buffered(BUILD_CONCURRENCY)
        .try_collect()
        .await?;
    warn_mismatch(built.iter().map(|(_, mismatch)| mismatch).sum());
    Ok(built.into_iter().map(|(request, _)| request).collect())
}

/// vLLM's `prefix_repetition` dataset: `num_prefixes` random prefixes, each followed by
/// `num_requests / num_prefixes` random suffixes, shuffled.
pub async fn prefix_repetition(
    tokenizer: &PromptTokenizer,
    config: &PrefixRepetitionConfig,
) -> Result<Vec<RequestInput>, BenchError> {
    let num_prefixes = config.num_prefixes.max(1);
    let prompts_per_prefix = config.num_requests / num_prefixes;
    if prompts_per_prefix == 0 {
        return Err(BenchError::InvalidArgument(format!(
            "num_requests ({}) must be greater than or equal to num_prefixes ({num_prefixes})",
            config.num_requests
        )));
    }
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut requests = Vec::with_capacity(num_prefixes * prompts_per_prefix);
    if !tokenizer.is_exact() {
        for _ in 0..num_prefixes {
            let prefix = random_words(config.prefix_len, &mut rng);
            for _ in 0..prompts_per_prefix {
                let mut words = prefix.clone();
                words.extend(random_words(config.suffix_len, &mut rng));
                requests.push(RequestInput {
                    prompt: words.join(" "),
                    prompt_len: config.prefix_len + config.suffix_len,
                    output_len: config.output_len,
                    json_schema: None,
                });
            }
        }
        requests.shuffle(&mut rng);
        return Ok(requests);
    }
    let allowed = tokenizer.allowed_tokens();
    let mut total_mismatch = 0;
    for prefix_index in 0..num_prefixes {
        let mut prefix_rng = request_rng(config.seed ^ 0x5052_4546, prefix_index as u64);
        let start = random_tokens(allowed, config.prefix_len, &mut prefix_rng);
        let (_, prefix, mismatch) =
            decode_to_target_len(tokenizer, start, config.prefix_len, &mut prefix_rng).await?;
        total_mismatch += mismatch;
        let built: Vec<(RequestInput, i64)> = stream::iter(0..prompts_per_prefix)
            .map(|suffix_index| {
                let prefix = prefix.clone();
                let index = (prefix_index * prompts_per_prefix + suffix_index) as u64;
                async move {
                    let mut suffix_rng = request_rng(config.seed, index);
                    let start = random_tokens(allowed, config.suffix_len, &mut suffix_rng);
                    let (_, suffix, mismatch) =
                        decode_to_target_len(tokenizer, start, config.suffix_len, &mut suffix_rng)
                            .await?;
                    let mut combined = prefix;
                    combined.extend(suffix);
                    let prompt = tokenizer.decode(&combined).await?;
                    let request = RequestInput {
                        prompt,
                        prompt_len: combined.len() + tokenizer.num_special_tokens(),
                        output_len: config.output_len,
                        json_schema: None,
                    };
                    Ok::<_, BenchError>((request, mismatch))
                }
            })
            .buffered(BUILD_CONCURRENCY)
            .try_collect()
            .await?;
        for (request, mismatch) in built {
            total_mismatch += mismatch;
            requests.push(request);
        }
    }
    warn_mismatch(total_mismatch);
    requests.shuffle(&mut rng);
    Ok(requests)
}
