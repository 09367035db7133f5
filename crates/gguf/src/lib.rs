//! GGUF v2/v3 file reader.
//!
//! GGUF is llama.cpp's single-file model format: a header of typed metadata key/values
//! (architecture hyper-parameters, tokenizer vocabulary, chat template) followed by tensor
//! infos and an aligned data section. This crate parses the header, memory-maps the file and
//! hands out tensor bytes without copying; interpreting the bytes (dequantizing, repacking) is
//! the compute layer's job (`tokenmill-kernels`), mapping names to a model is `tokenmill-models`'.
//!
//! Key types: [`GgufFile`] (an opened file), [`MetadataValue`], [`TensorInfo`], [`GgmlType`].
//! A small [`GgufWriter`] exists so tests can build tiny models without a hub.
//!
//! ```no_run
//! # fn main() -> Result<(), tokenmill_gguf::GgufError> {
//! let file = tokenmill_gguf::GgufFile::open(std::path::Path::new("model.gguf"))?;
//! let arch = file.get_str("general.architecture");
//! for info in file.tensors() {
//!     let bytes = file.tensor_data(info)?;
//!     println!("{} {:?} {} {}", info.name, info.dims, info.ggml_type, bytes.len());
//! }
//! # let _ = arch; Ok(()) }
//! ```

mod reader;
mod types;
mod writer;

pub use reader::{GgufFile, TensorBytes};
pub use types::{GgmlType, MetadataValue, TensorInfo};
pub use writer::GgufWriter;

/// Everything that can go wrong reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic {0:#010x})")]
    BadMagic(u32),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("GGUF file truncated while reading {what} at byte {offset}")]
    Truncated { what: &'static str, offset: usize },
    #[error("invalid GGUF metadata value type {0}")]
    BadValueType(u32),
    #[error("invalid UTF-8 in GGUF string at byte {0}")]
    BadString(usize),
    #[error("tensor {name}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensor {name} has type {ggml_type}, whose block layout this reader does not know")]
    UnsupportedTensorType { name: String, ggml_type: GgmlType },
}
