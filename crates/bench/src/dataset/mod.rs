//! Benchmark datasets (vLLM's `random`, `sharegpt`, `prefix_repetition`, `custom`, the
//! structured-output benchmark's `json`/`json-unique`, tokenmill's `input_grounded`): each
//! yields [`RequestInput`]s with a prompt, its token count and the output length to ask for.

mod files;
mod grounded;
mod structured;
mod synthetic;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::args::{BenchServeArgs, DatasetName};
use crate::client::RequestInput;
use crate::error::BenchError;
use crate::tokenize::PromptTokenizer;

pub use files::{load_custom, load_sharegpt};
pub use grounded::input_grounded;
pub use structured::{builtin_schemas, json_dataset, StructuredConfig};
pub use synthetic::{prefix_repetition, random_dataset, PrefixRepetitionConfig, RandomConfig};

/// Builds `num_requests` requests for the dataset the options name.
pub async fn sample_requests(
    args: &BenchServeArgs,
    tokenizer: &PromptTokenizer,
    num_requests: usize,
) -> Result<Vec<RequestInput>, BenchError> {
    match args.dataset_name {
        DatasetName::Random => {
            let config = RandomConfig {
                num_requests,
                input_len: args.random_input_len,
                output_len: args.random_output_len,
                range_ratio: args.random_range_ratio,
                prefix_len: args.random_prefix_len,
                seed: args.seed,
            };
            random_dataset(tokenizer, &config).await
        }
        DatasetName::PrefixRepetition => {
            let config = PrefixRepetitionConfig {
                num_requests,
                prefix_len: args.prefix_repetition_prefix_len,
                suffix_len: args.prefix_repetition_suffix_len,
                num_prefixes: args.prefix_repetition_num_prefixes,
                output_len: args.prefix_repetition_output_len,
                seed: args.seed,
            };
            prefix_repetition(tokenizer, &config).await
        }
        DatasetName::InputGrounded => {
            input_grounded(
                tokenizer,
                num_requests,
                args.input_grounded_output_len,
                args.seed,
            )
            .await
        }
        DatasetName::Json | DatasetName::JsonUnique => {
            let config = StructuredConfig {
                num_requests,
                output_len: args.structured_output_len,
                ratio: args.structured_output_ratio,
                unique: args.dataset_name == DatasetName::JsonUnique,
                schema_path: args.json_schema_path.as_deref(),
                seed: args.seed,
            };
            json_dataset(tokenizer, &config).await
        }
        DatasetName::Sharegpt => {
            let path = required_path(args)?;
            load_sharegpt(
                path,
                tokenizer,
                num_requests,
                args.sharegpt_output_len,
                args.seed,
            )
            .await
        }
        DatasetName::Custom => {
            let path = required_path(args)?;
            load_custom(
                path,
                tokenizer,
                num_requests,
                args.custom_output_len,
                args.seed,
            )
            .await
        }
    }
}

fn required_path(args: &BenchServeArgs) -> Result<&std::path::Path, BenchError> {
    args.dataset_path
        .as_deref()
        .ok_or_else(|| BenchError::InvalidArgument("--dataset-path is required".into()))
}

/// An independent, reproducible random stream for request `index` of a run seeded `seed`,
/// so requests can be built concurrently and still come out the same every time.
pub(crate) fn request_rng(seed: u64, index: u64) -> StdRng {
    // splitmix64 over (seed, index): nearby inputs give unrelated seeds.
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_add(1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    StdRng::seed_from_u64(z ^ (z >> 31))
}

/// vLLM's oversampling: when a file yields fewer requests than asked, repeat random ones.
pub(crate) fn oversample(requests: &mut Vec<RequestInput>, num_requests: usize, rng: &mut StdRng) {
    use rand::seq::IndexedRandom;
    if requests.is_empty() || requests.len() >= num_requests {
        return;
    }
    let missing = num_requests - requests.len();
    println!("Oversampling requests to reach {num_requests} total samples.");
    let extra: Vec<RequestInput> = (0..missing)
        .filter_map(|_| requests.choose(rng).cloned())
        .collect();
    requests.extend(extra);
}
