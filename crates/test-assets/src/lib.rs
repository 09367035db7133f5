//! tokenmill-test-assets: where the tests find the model files they run on, in one place.
//!
//! Every asset has an environment variable, a default path in the model cache
//! (`$TOKENMILL_MODEL_DIR`, else `~/.cache/tokenmill/models`, the directory the fetch scripts
//! and `tokenmill serve` use) and the script that makes it. The default model is always
//! required: a test that needs it fails without it. The others are optional on a developer
//! machine: [`Asset::or_skip`] prints that the test skipped and the test passes. Under
//! `TOKENMILL_REQUIRE_ASSETS=1`, which `scripts/test.sh` sets after making its assets (CI runs
//! it), a missing asset that the script makes fails the test instead, so CI cannot pass by
//! skipping those. Two kinds are not made there yet (`made_by_test_script: false`): the
//! MiniLM GGUF (llama.cpp's converter needs torch and mistral_common) and the re-quantized
//! default models (regenerated, the Q5_0 file does not reproduce its fixture; see
//! `scripts/make-test-assets.sh`).
//!
//! Key items: the [`Asset`] constants ([`DEFAULT_MODEL`], [`GEMMA3_270M`], [`GEMMA4_VOCAB`],
//! [`MINILM`], [`MINILM_GGUF`]) and [`requantized_default_model`]; [`default_model`] is the one
//! `model_path()` every crate's tests call.
//!
//! ```no_run
//! let model = tokenmill_test_assets::default_model();
//! let Some(gemma) = tokenmill_test_assets::GEMMA3_270M.or_skip("my_gemma_test") else {
//!     return;
//! };
//! # let _ = (model, gemma);
//! ```

use std::borrow::Cow;
use std::path::PathBuf;

/// The variable that turns a missing optional asset from a skip into a failure.
pub const REQUIRE_ASSETS: &str = "TOKENMILL_REQUIRE_ASSETS";

/// A file or directory a test runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    /// What it is, for messages.
    pub what: &'static str,
    /// The environment variable that names it (or, with `env_names_dir`, its directory).
    pub env: &'static str,
    pub env_names_dir: bool,
    /// Its file name under the cache directory when the variable is unset.
    pub file_name: Cow<'static, str>,
    /// The command that makes it.
    pub made_by: &'static str,
    /// Whether `scripts/test.sh` makes it, so that under `TOKENMILL_REQUIRE_ASSETS=1` its
    /// absence is a failure.
    pub made_by_test_script: bool,
}

/// SmolLM2-135M-Instruct Q4_1, the default model (`scripts/fetch-model.sh`).
pub const DEFAULT_MODEL: Asset = Asset {
    what: "the default model (SmolLM2-135M-Instruct Q4_1)",
    env: "TOKENMILL_TEST_MODEL",
    env_names_dir: false,
    file_name: Cow::Borrowed("SmolLM2-135M-Instruct.Q4_1.gguf"),
    made_by: "scripts/fetch-model.sh",
    made_by_test_script: true,
};

/// Gemma 3 270M Q4_K_M (`scripts/fetch-gemma3.sh`).
pub const GEMMA3_270M: Asset = Asset {
    what: "Gemma 3 270M Q4_K_M",
    env: "TOKENMILL_GEMMA3_MODEL",
    env_names_dir: false,
    file_name: Cow::Borrowed("gemma-3-270m-q4_k_m.gguf"),
    made_by: "scripts/fetch-gemma3.sh",
    made_by_test_script: true,
};

/// Gemma 4's tokenizer as llama.cpp's vocabulary-only GGUF (`scripts/fetch-gemma4-vocab.sh`).
pub const GEMMA4_VOCAB: Asset = Asset {
    what: "Gemma 4's vocabulary-only GGUF (llama.cpp's models/ggml-vocab-gemma-4.gguf)",
    env: "TOKENMILL_GEMMA4_VOCAB",
    env_names_dir: false,
    file_name: Cow::Borrowed("ggml-vocab-gemma-4.gguf"),
    made_by: "scripts/fetch-gemma4-vocab.sh",
    made_by_test_script: true,
};

/// all-MiniLM-L6-v2's HF directory (`scripts/fetch-minilm.sh`).
pub const MINILM: Asset = Asset {
    what: "all-MiniLM-L6-v2",
    env: "TOKENMILL_MINILM_MODEL",
    env_names_dir: false,
    file_name: Cow::Borrowed("all-MiniLM-L6-v2"),
    made_by: "scripts/fetch-minilm.sh",
    made_by_test_script: true,
};

/// all-MiniLM-L6-v2 converted to GGUF by llama.cpp's converter (`scripts/make-minilm-gguf.sh`).
pub const MINILM_GGUF: Asset = Asset {
    what: "all-MiniLM-L6-v2 as GGUF (llama.cpp's converter)",
    env: "TOKENMILL_MINILM_GGUF",
    env_names_dir: false,
    file_name: Cow::Borrowed("all-MiniLM-L6-v2.f32.gguf"),
    made_by: "scripts/make-minilm-gguf.sh",
    made_by_test_script: false,
};

/// The default model re-quantized to `type_name` (`Q5_0`, `IQ4_XS`, ...) by
/// `scripts/make-test-assets.sh`, in the reference cache (`$TOKENMILL_REFERENCE_DIR`, else
/// `~/.cache/tokenmill/reference`).
pub fn requantized_default_model(type_name: &str) -> Asset {
    Asset {
        what: "the default model re-quantized for a parity test",
        env: "TOKENMILL_REFERENCE_DIR",
        env_names_dir: true,
        file_name: Cow::Owned(format!(
            "SmolLM2-135M-Instruct.Q4_1.requantized-{type_name}.gguf"
        )),
        made_by: "scripts/make-test-assets.sh requantized",
        made_by_test_script: false,
    }
}

impl Asset {
    /// Where it is or would be: the variable's value, else its place in the cache. For the
    /// re-quantized files the variable names a directory (they are several).
    pub fn path(&self) -> PathBuf {
        let from_env = std::env::var_os(self.env).map(PathBuf::from);
        if self.env_names_dir {
            let dir = from_env.unwrap_or_else(|| home().join(".cache/tokenmill/reference"));
            return dir.join(self.file_name.as_ref());
        }
        from_env.unwrap_or_else(|| model_cache_dir().join(self.file_name.as_ref()))
    }

    /// Its path; a test that cannot run without it fails with what to run.
    #[allow(clippy::panic)]
    pub fn require(&self) -> PathBuf {
        let path = self.path();
        if !path.exists() {
            panic!("{}", self.missing(&path));
        }
        path
    }

    /// Its path, or `None` after printing that `test` skipped; under
    /// `TOKENMILL_REQUIRE_ASSETS=1` a missing asset that `scripts/test.sh` makes fails `test`
    /// instead.
    #[allow(clippy::panic)]
    pub fn or_skip(&self, test: &str) -> Option<PathBuf> {
        let path = self.path();
        if path.exists() {
            return Some(path);
        }
        let missing = self.missing(&path);
        if self.made_by_test_script && assets_required() {
            panic!("{test}: {missing} ({REQUIRE_ASSETS}=1: a missing asset fails)");
        }
        eprintln!("{test}: skipped: {missing}");
        None
    }

    fn missing(&self, path: &std::path::Path) -> String {
        format!(
            "{} not found at {} (run {} or set {})",
            self.what,
            path.display(),
            self.made_by,
            self.env
        )
    }
}

/// Whether a missing optional asset fails (`TOKENMILL_REQUIRE_ASSETS=1`).
pub fn assets_required() -> bool {
    std::env::var(REQUIRE_ASSETS).is_ok_and(|value| value == "1")
}

/// The variable naming the PostgreSQL server of the shared Responses store tests.
pub const POSTGRES_URL: &str = "TOKENMILL_TEST_POSTGRES";

/// The PostgreSQL URL the shared-store tests run against (`scripts/start-postgres.sh` starts
/// one and prints it; `scripts/test.sh` exports it as `TOKENMILL_TEST_POSTGRES`), or `None`
/// after printing that `test` skipped; under `TOKENMILL_REQUIRE_ASSETS=1` its absence fails.
#[allow(clippy::panic)]
pub fn postgres_url_or_skip(test: &str) -> Option<String> {
    if let Some(url) = std::env::var(POSTGRES_URL)
        .ok()
        .filter(|url| !url.is_empty())
    {
        return Some(url);
    }
    let missing =
        format!("no PostgreSQL server (run scripts/start-postgres.sh and set {POSTGRES_URL})");
    if assets_required() {
        panic!("{test}: {missing} ({REQUIRE_ASSETS}=1: a missing asset fails)");
    }
    eprintln!("{test}: skipped: {missing}");
    None
}

/// The default model's path; the test fails without it.
pub fn default_model() -> PathBuf {
    DEFAULT_MODEL.require()
}

/// `$TOKENMILL_MODEL_DIR`, else `$HOME/.cache/tokenmill/models` (tokenmill-models'
/// `model_cache_dir`, which the fetch scripts share).
pub fn model_cache_dir() -> PathBuf {
    std::env::var_os("TOKENMILL_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/tokenmill/models"))
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_overrides_the_cache_path() {
        // Only this test reads TOKENMILL_MINILM_GGUF in this process.
        let asset = MINILM_GGUF;
        std::env::set_var("TOKENMILL_MINILM_GGUF", "/nonexistent/minilm.gguf");
        assert_eq!(asset.path(), PathBuf::from("/nonexistent/minilm.gguf"));
        std::env::remove_var("TOKENMILL_MINILM_GGUF");
        assert!(asset.path().ends_with("all-MiniLM-L6-v2.f32.gguf"));
    }

    #[test]
    fn requantized_files_live_in_the_reference_dir() {
        let asset = requantized_default_model("Q5_0");
        assert!(asset
            .path()
            .ends_with("SmolLM2-135M-Instruct.Q4_1.requantized-Q5_0.gguf"));
    }
}
