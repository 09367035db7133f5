//! Uniform access to named tensors in a GGUF file or a set of safetensors files.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorInfo as SafetensorsInfo;
use safetensors::Dtype as SafetensorsDtype;
use serde::Deserialize;
use tokenmill_gguf::GgufFile;
use tokenmill_kernels::DType;

use crate::error::{io_error, ModelError, Result};

/// One tensor's element type, logical shape (outermost first, so a linear weight is
/// `[out_features, in_features]`) and raw little-endian bytes (borrowed from the GGUF map,
/// read on demand from safetensors files).
#[derive(Debug, Clone)]
pub(crate) struct RawTensor<'a> {
    pub dtype: DType,
    pub bytes: Cow<'a, [u8]>,
    pub shape: &'a [usize],
}

/// Tensors by name, from whichever container the model came in. A GGUF file is borrowed so
/// the caller can read its tokenizer from the same open file.
pub(crate) enum TensorStore<'f> {
    Gguf {
        file: &'f GgufFile,
        /// GGUF dims reversed into logical order, per tensor name.
        shapes: HashMap<String, Vec<usize>>,
    },
    Safetensors(SafetensorsStore),
}

pub(crate) struct SafetensorsStore {
    /// Shards are read tensor by tensor rather than mapped: weights are converted into the
    /// compute layer's layout at load anyway, and reading keeps this crate free of `unsafe`.
    files: Vec<(PathBuf, File)>,
    tensors: HashMap<String, SafetensorsEntry>,
    /// Tensors a family derived from the file's at load (gpt-oss's experts, re-laid out),
    /// looked up before the file's.
    derived: HashMap<String, DerivedTensor>,
}

/// A tensor built in memory: its type, logical shape and GGML-layout bytes.
pub(crate) struct DerivedTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// A safetensors tensor of any element type, as stored: its dtype name, shape and bytes.
pub(crate) struct StoredTensor {
    pub dtype: SafetensorsDtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

struct SafetensorsEntry {
    file_index: usize,
    dtype: SafetensorsDtype,
    shape: Vec<usize>,
    /// Absolute byte range within the mapped file.
    start: usize,
    end: usize,
}

impl<'f> TensorStore<'f> {
    pub fn from_gguf(file: &'f GgufFile) -> TensorStore<'f> {
        let shapes = file
            .tensors()
            .iter()
            .map(|info| {
                let shape = info.dims.iter().rev().map(|&d| d as usize).collect();
                (info.name.clone(), shape)
            })
            .collect();
        TensorStore::Gguf { file, shapes }
    }

    /// A GGUF tensor's bytes kept in the memory map (`None` for safetensors, which are read).
    pub fn mapped_bytes(&self, name: &str) -> Option<tokenmill_gguf::TensorBytes> {
        match self {
            TensorStore::Gguf { file, .. } => file
                .tensor(name)
                .and_then(|info| file.tensor_bytes(info).ok()),
            TensorStore::Safetensors(_) => None,
        }
    }

    /// Opens `model.safetensors`, or every shard named in `model.safetensors.index.json`.
    pub fn from_hf_directory(dir: &Path) -> Result<TensorStore<'f>> {
        let index_path = dir.join("model.safetensors.index.json");
        let files = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(io_error(&index_path))?;
            safetensors_shards_from_index(&text)
                .map_err(|message| ModelError::Safetensors {
                    path: index_path.clone(),
                    message,
                })?
                .into_iter()
                .map(|shard| dir.join(shard))
                .collect()
        } else {
            let single = dir.join("model.safetensors");
            if single.is_file() {
                vec![single]
            } else {
                let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                    .map_err(io_error(dir))?
                    .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                    .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
                    .collect();
                found.sort();
                if found.is_empty() {
                    return Err(ModelError::ModelNotFound(format!(
                        "{} has no model.safetensors, model.safetensors.index.json or \
                         *.safetensors file",
                        dir.display()
                    )));
                }
                found
            }
        };
        SafetensorsStore::open(files).map(TensorStore::Safetensors)
    }

    /// Opens one safetensors file (a PEFT adapter's `adapter_model.safetensors`).
    pub fn from_safetensors_file(path: &Path) -> Result<TensorStore<'f>> {
        SafetensorsStore::open(vec![path.to_path_buf()]).map(TensorStore::Safetensors)
    }

    /// Renames every safetensors tensor whose name starts with `from` to start with `to`
    /// instead (a multimodal checkpoint's `model.language_model.` text tensors read as a text
    /// model's `model.`); a GGUF store is left alone.
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        if let TensorStore::Safetensors(store) = self {
            let renamed: Vec<String> = store
                .tensors
                .keys()
                .filter(|name| name.starts_with(from))
                .cloned()
                .collect();
            for name in renamed {
                if let Some(entry) = store.tensors.remove(&name) {
                    store
                        .tensors
                        .insert(format!("{to}{}", &name[from.len()..]), entry);
                }
            }
        }
    }

    /// Every tensor name in the store.
    pub fn names(&self) -> Vec<&str> {
        match self {
            TensorStore::Gguf { shapes, .. } => shapes.keys().map(String::as_str).collect(),
            TensorStore::Safetensors(store) => store.tensors.keys().map(String::as_str).collect(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            TensorStore::Gguf { shapes, .. } => shapes.contains_key(name),
            TensorStore::Safetensors(store) => {
                store.tensors.contains_key(name) || store.derived.contains_key(name)
            }
        }
    }

    /// A safetensors tensor as stored, of any element type (`None` for a GGUF store or a
    /// missing name).
    pub fn read_stored(&self, name: &str) -> Option<Result<StoredTensor>> {
        match self {
            TensorStore::Safetensors(store) if store.tensors.contains_key(name) => {
                Some(store.read(name))
            }
            _ => None,
        }
    }

    /// Adds a tensor a family derived at load, found by [`Self::get`] before the file's
    /// (ignored by a GGUF store, whose tensors are already in GGML's layout).
    pub fn insert_derived(&mut self, name: String, tensor: DerivedTensor) {
        if let TensorStore::Safetensors(store) = self {
            store.derived.insert(name, tensor);
        }
    }

    /// Looks a tensor up; an element type the compute layer cannot use is an error naming
    /// the tensor and the type.
    pub fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        match self {
            TensorStore::Gguf { file, shapes } => {
                let info = file
                    .tensor(name)
                    .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
                let shape = shapes
                    .get(name)
                    .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
                let dtype = DType::from_ggml_id(info.ggml_type.id()).ok_or_else(|| {
                    ModelError::UnsupportedTensorType {
                        tensor: name.into(),
                        dtype: info.ggml_type.name(),
                    }
                })?;
                Ok(RawTensor {
                    dtype,
                    bytes: Cow::Borrowed(file.tensor_data(info)?),
                    shape,
                })
            }
            TensorStore::Safetensors(store) => store.get(name),
        }
    }
}

impl SafetensorsStore {
    fn open(paths: Vec<PathBuf>) -> Result<SafetensorsStore> {
        let mut files = Vec::with_capacity(paths.len());
        let mut tensors = HashMap::new();
        for (file_index, path) in paths.into_iter().enumerate() {
            let mut file = File::open(&path).map_err(io_error(&path))?;
            let file_len = file.metadata().map_err(io_error(&path))?.len();
            let (data_start, infos) = read_safetensors_header(&mut file, &path)?;
            for (name, info) in infos {
                let (start, end) = info.data_offsets;
                let element_bytes = info.dtype.bitsize().div_ceil(8);
                let expected = info.shape.iter().product::<usize>() * element_bytes;
                if end < start || end - start != expected || (data_start + end) as u64 > file_len {
                    return Err(ModelError::Safetensors {
                        path: path.clone(),
                        message: format!(
                            "tensor `{name}` has data offsets {start}..{end}, inconsistent with \
                             its shape {:?} or the file size {file_len}",
                            info.shape
                        ),
                    });
                }
                tensors.insert(
                    name,
                    SafetensorsEntry {
                        file_index,
                        dtype: info.dtype,
                        shape: info.shape,
                        start: data_start + start,
                        end: data_start + end,
                    },
                );
            }
            files.push((path, file));
        }
        // A decoder saved as its bare `*Model` (Qwen3-Embedding: `embed_tokens.weight`,
        // `layers.N.…`, `norm.weight`) is read under the `*ForCausalLM` names, as vLLM's
        // loader maps it.
        if !tensors.contains_key("model.embed_tokens.weight")
            && tensors.contains_key("embed_tokens.weight")
        {
            tensors = tensors
                .into_iter()
                .map(|(name, entry)| {
                    if name.starts_with("lm_head.") {
                        (name, entry)
                    } else {
                        (format!("model.{name}"), entry)
                    }
                })
                .collect();
        }
        Ok(SafetensorsStore {
            files,
            tensors,
            derived: HashMap::new(),
        })
    }

    fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        if let Some(derived) = self.derived.get(name) {
            return Ok(RawTensor {
                dtype: derived.dtype,
                bytes: Cow::Borrowed(&derived.bytes),
                shape: &derived.shape,
            });
        }
        let entry = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let dtype = match entry.dtype {
            SafetensorsDtype::F32 => DType::F32,
            SafetensorsDtype::F16 => DType::F16,
            SafetensorsDtype::BF16 => DType::BF16,
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    tensor: name.into(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        Ok(RawTensor {
            dtype,
            bytes: Cow::Owned(self.read(name)?.bytes),
            shape: &entry.shape,
        })
    }

    /// Reads tensor `name` as stored, whatever its element type.
    fn read(&self, name: &str) -> Result<StoredTensor> {
        let entry = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let (path, file) = self
            .files
            .get(entry.file_index)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let mut bytes = vec![0u8; entry.end.saturating_sub(entry.start)];
        let mut reader = file;
        reader
            .seek(SeekFrom::Start(entry.start as u64))
            .and_then(|_| reader.read_exact(&mut bytes))
            .map_err(|error| ModelError::Safetensors {
                path: path.clone(),
                message: format!("reading tensor `{name}`: {error}"),
            })?;
        Ok(StoredTensor {
            dtype: entry.dtype,
            shape: entry.shape.clone(),
            bytes,
        })
    }
}

/// Reads a safetensors header: the byte offset where tensor data starts, and each tensor's
/// info (the optional `__metadata__` entry is skipped).
fn read_safetensors_header(
    file: &mut File,
    path: &Path,
) -> Result<(usize, Vec<(String, SafetensorsInfo)>)> {
    let invalid = |message: String| ModelError::Safetensors {
        path: path.to_path_buf(),
        message,
    };
    let mut length_prefix = [0u8; 8];
    file.read_exact(&mut length_prefix)
        .map_err(|e| invalid(format!("reading header length: {e}")))?;
    let header_len = u64::from_le_bytes(length_prefix);
    if header_len > 100 * 1024 * 1024 {
        return Err(invalid(format!(
            "header of {header_len} bytes is implausibly large"
        )));
    }
    let mut header = Vec::new();
    file.take(header_len)
        .read_to_end(&mut header)
        .map_err(|e| invalid(format!("reading header: {e}")))?;
    let entries: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| invalid(format!("header JSON: {e}")))?;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == "__metadata__" {
            continue;
        }
        let info: SafetensorsInfo = serde_json::from_value(value)
            .map_err(|e| invalid(format!("header entry `{name}`: {e}")))?;
        infos.push((name, info));
    }
    Ok((8 + header.len(), infos))
}

#[derive(Deserialize)]
struct SafetensorsIndex {
    weight_map: HashMap<String, String>,
}

/// The distinct shard file names of a `model.safetensors.index.json`, sorted.
pub fn safetensors_shards_from_index(text: &str) -> std::result::Result<Vec<String>, String> {
    let index: SafetensorsIndex = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut shards: Vec<String> = index.weight_map.into_values().collect();
    shards.sort();
    shards.dedup();
    if let Some(bad) = shards
        .iter()
        .find(|shard| shard.contains("..") || shard.starts_with('/'))
    {
        return Err(format!("shard name `{bad}` escapes the model directory"));
    }
    Ok(shards)
}
