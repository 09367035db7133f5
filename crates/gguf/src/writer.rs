//! A minimal GGUF v3 writer, so tests can build tiny models in the real format.

use std::path::Path;

use crate::reader::{align_up, DEFAULT_ALIGNMENT, MAGIC};
use crate::{GgmlType, GgufError, MetadataValue};

/// Collects metadata and tensors, then serializes a GGUF v3 image.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor; `dims` in GGML order (innermost first), `data` already encoded.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        self
    }

    /// Adds an f32 tensor from values.
    pub fn add_f32_tensor(&mut self, name: &str, dims: &[u64], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, data)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&value_type(value).to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for tensor in &self.tensors {
            write_string(&mut out, &tensor.name);
            out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
            for d in &tensor.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&tensor.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = align_up(offset + tensor.data.len() as u64, DEFAULT_ALIGNMENT);
        }
        let data_start = align_up(out.len() as u64, DEFAULT_ALIGNMENT);
        for (tensor, offset) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + offset) as usize, 0);
            out.extend_from_slice(&tensor.data);
        }
        out
    }

    pub fn write_to(&self, path: &Path) -> Result<(), GgufError> {
        std::fs::write(path, self.to_bytes()).map_err(|source| GgufError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

fn value_type(value: &MetadataValue) -> u32 {
    match value {
        MetadataValue::U8(_) => 0,
        MetadataValue::I8(_) => 1,
        MetadataValue::U16(_) => 2,
        MetadataValue::I16(_) => 3,
        MetadataValue::U32(_) => 4,
        MetadataValue::I32(_) => 5,
        MetadataValue::F32(_) => 6,
        MetadataValue::Bool(_) => 7,
        MetadataValue::String(_) => 8,
        MetadataValue::Array(_) => 9,
        MetadataValue::U64(_) => 10,
        MetadataValue::I64(_) => 11,
        MetadataValue::F64(_) => 12,
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &MetadataValue) {
    match value {
        MetadataValue::U8(v) => out.push(*v),
        MetadataValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::Bool(v) => out.push(u8::from(*v)),
        MetadataValue::String(s) => write_string(out, s),
        MetadataValue::Array(items) => {
            // An empty array's element type is irrelevant to readers; use u8.
            let elem_type = items.first().map_or(0, value_type);
            out.extend_from_slice(&elem_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
        MetadataValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}
