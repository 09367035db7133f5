//! Parsing the GGUF header out of a memory-mapped file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::{GgmlType, GgufError, MetadataValue, TensorInfo};

pub(crate) const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;

/// An opened GGUF file: parsed metadata and tensor infos over a read-only memory map.
#[derive(Debug)]
pub struct GgufFile {
    version: u32,
    metadata: BTreeMap<String, MetadataValue>,
    tensors: Vec<TensorInfo>,
    data_offset: usize,
    alignment: u64,
    bytes: Bytes,
}

/// The file's bytes: a memory map for real files, an owned buffer for in-memory parsing;
/// shared, so a tensor can be kept in place after the file is dropped ([`TensorBytes`]).
#[derive(Debug, Clone)]
enum Bytes {
    Mapped(Arc<Mmap>),
    Owned(Arc<Vec<u8>>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Owned(vec) => vec,
        }
    }
}

/// One tensor's bytes, kept where the file holds them (the memory map stays open while one
/// lives): for a table read a row at a time that should not be copied into memory whole.
#[derive(Debug, Clone)]
pub struct TensorBytes {
    bytes: Bytes,
    start: usize,
    len: usize,
}

impl TensorBytes {
    pub fn as_slice(&self) -> &[u8] {
        // In range: checked by `GgufFile::tensor_bytes` when this was made.
        &self.bytes.as_slice()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Memory-maps a model file read-only: the workspace's one `unsafe` outside the kernels
/// (`unsafe_code` is denied everywhere else; ARCHITECTURE.md invariant 6).
#[allow(unsafe_code)]
fn map_read_only(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and private to this process. Model files are not expected
    // to be modified while a server has them open; if one is truncated underneath us the
    // process gets SIGBUS, the same contract llama.cpp and safetensors loaders have.
    unsafe { Mmap::map(file) }
}

impl GgufFile {
    /// Opens and memory-maps `path`, parsing the header. Tensor bytes are not read until asked.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io_err = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let map = map_read_only(&file).map_err(io_err)?;
        Self::parse(Bytes::Mapped(Arc::new(map)))
    }

    /// Parses a GGUF image held in memory (tests, embedded models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Bytes::Owned(Arc::new(bytes)))
    }

    fn parse(bytes: Bytes) -> Result<GgufFile, GgufError> {
        let mut cursor = Cursor {
            bytes: bytes.as_slice(),
            pos: 0,
        };
        let magic = cursor.u32("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = cursor.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = cursor.u64("tensor count")?;
        let kv_count = cursor.u64("metadata count")?;

        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = cursor.string("metadata key")?;
            let value_type = cursor.u32("metadata value type")?;
            let value = cursor.value(value_type)?;
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment").and_then(|v| v.as_u64()) {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => DEFAULT_ALIGNMENT,
        };

        let mut tensors = Vec::new();
        for _ in 0..tensor_count {
            let name = cursor.string("tensor name")?;
            let n_dims = cursor.u32("tensor rank")?;
            if n_dims > 8 {
                return Err(GgufError::BadTensor {
                    name,
                    reason: format!("rank {n_dims} is not plausible"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cursor.u64("tensor dimension")?);
            }
            let ggml_type = GgmlType::from_id(cursor.u32("tensor type")?);
            let offset = cursor.u64("tensor offset")?;
            let size_bytes = tensor_size(&name, &dims, ggml_type)?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size_bytes,
            });
        }

        let data_offset = align_up(cursor.pos as u64, alignment);
        let file_len = bytes.as_slice().len() as u64;
        for info in &tensors {
            let start = data_offset + info.offset;
            if info.offset % alignment != 0 {
                return Err(GgufError::BadTensor {
                    name: info.name.clone(),
                    reason: format!("offset {} is not {alignment}-aligned", info.offset),
                });
            }
            if start
                .checked_add(info.size_bytes)
                .is_none_or(|end| end > file_len)
            {
                return Err(GgufError::BadTensor {
                    name: info.name.clone(),
                    reason: format!(
                        "data [{start}, +{}) runs past the end of the file ({file_len} bytes)",
                        info.size_bytes
                    ),
                });
            }
        }
        let data_offset = usize::try_from(data_offset).map_err(|_| GgufError::Truncated {
            what: "data section",
            offset: cursor.pos,
        })?;

        Ok(GgufFile {
            version,
            metadata,
            tensors,
            data_offset,
            alignment,
            bytes,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetadataValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetadataValue::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(MetadataValue::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(MetadataValue::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(MetadataValue::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Option<&[MetadataValue]> {
        self.get(key).and_then(MetadataValue::as_array)
    }

    /// `general.architecture` (`llama`, `qwen2`, ...).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of one tensor (bounds were checked when the header was parsed).
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        let (start, len) = self.tensor_range(info)?;
        Ok(&self.bytes.as_slice()[start..start + len])
    }

    /// One tensor's bytes as a handle that keeps the memory map open ([`TensorBytes`]).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<TensorBytes, GgufError> {
        let (start, len) = self.tensor_range(info)?;
        Ok(TensorBytes {
            bytes: self.bytes.clone(),
            start,
            len,
        })
    }

    /// Where one tensor's bytes are in the file, checked to lie inside it.
    fn tensor_range(&self, info: &TensorInfo) -> Result<(usize, usize), GgufError> {
        let bad = |reason: &str| GgufError::BadTensor {
            name: info.name.clone(),
            reason: reason.to_string(),
        };
        let start = usize::try_from(info.offset)
            .ok()
            .and_then(|o| o.checked_add(self.data_offset))
            .ok_or_else(|| bad("offset overflows"))?;
        let len = usize::try_from(info.size_bytes).map_err(|_| bad("size overflows"))?;
        match start.checked_add(len) {
            Some(end) if end <= self.bytes.as_slice().len() => Ok((start, len)),
            _ => Err(bad("data runs past the end of the file")),
        }
    }
}

fn tensor_size(name: &str, dims: &[u64], ggml_type: GgmlType) -> Result<u64, GgufError> {
    let Some((block_elems, block_bytes)) = ggml_type.block_layout() else {
        return Err(GgufError::UnsupportedTensorType {
            name: name.to_string(),
            ggml_type,
        });
    };
    let bad = |reason: String| GgufError::BadTensor {
        name: name.to_string(),
        reason,
    };
    let inner = dims.first().copied().unwrap_or(1);
    if inner % block_elems != 0 {
        return Err(bad(format!(
            "inner dimension {inner} is not a multiple of the {ggml_type} block size {block_elems}"
        )));
    }
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("element count overflows".to_string()))?;
    (elements / block_elems)
        .checked_mul(block_bytes)
        .ok_or_else(|| bad("byte size overflows".to_string()))
}

pub(crate) fn align_up(value: u64, alignment: u64) -> u64 {
    value.div_ceil(alignment) * alignment
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let truncated = GgufError::Truncated {
            what,
            offset: self.pos,
        };
        let end = self.pos.checked_add(n).ok_or(truncated)?;
        let slice = self.bytes.get(self.pos..end).ok_or(GgufError::Truncated {
            what,
            offset: self.pos,
        })?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn len(&mut self, what: &'static str) -> Result<usize, GgufError> {
        let offset = self.pos;
        let len = self.u64(what)?;
        // A length can never exceed the bytes left; checking here keeps a corrupt header from
        // triggering a huge allocation.
        usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.bytes.len().saturating_sub(self.pos))
            .ok_or(GgufError::Truncated { what, offset })
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.len(what)?;
        let start = self.pos;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::BadString(start))
    }

    fn value(&mut self, value_type: u32) -> Result<MetadataValue, GgufError> {
        const WHAT: &str = "metadata value";
        Ok(match value_type {
            0 => MetadataValue::U8(u8::from_le_bytes(self.array(WHAT)?)),
            1 => MetadataValue::I8(i8::from_le_bytes(self.array(WHAT)?)),
            2 => MetadataValue::U16(u16::from_le_bytes(self.array(WHAT)?)),
            3 => MetadataValue::I16(i16::from_le_bytes(self.array(WHAT)?)),
            4 => MetadataValue::U32(u32::from_le_bytes(self.array(WHAT)?)),
            5 => MetadataValue::I32(i32::from_le_bytes(self.array(WHAT)?)),
            6 => MetadataValue::F32(f32::from_le_bytes(self.array(WHAT)?)),
            7 => MetadataValue::Bool(self.array::<1>(WHAT)?[0] != 0),
            8 => MetadataValue::String(self.string(WHAT)?),
            9 => {
                let elem_type = self.u32("array element type")?;
                let count = self.len("array length")?;
                let mut items = Vec::with_capacity(count.min(1 << 20));
                for _ in 0..count {
                    items.push(self.value(elem_type)?);
                }
                MetadataValue::Array(items)
            }
            10 => MetadataValue::U64(u64::from_le_bytes(self.array(WHAT)?)),
            11 => MetadataValue::I64(i64::from_le_bytes(self.array(WHAT)?)),
            12 => MetadataValue::F64(f64::from_le_bytes(self.array(WHAT)?)),
            other => return Err(GgufError::BadValueType(other)),
        })
    }
}
