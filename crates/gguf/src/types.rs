//! GGUF value and tensor-type vocabulary.

use std::fmt;

/// A GGML tensor element type, by its on-disk id.
///
/// Only the layout (elements per block, bytes per block) lives here; the compute layer decides
/// which types it can actually multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ4NL,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    /// OCP microscaling FP4: blocks of 32 as `{ u8 e; u8 qs[16] }` (an E8M0 scale, 4-bit E2M1
    /// values), gpt-oss's expert weights.
    MXFP4,
    /// Any id this reader has no layout for (the other IQ* types, TQ*, ...).
    Other(u32),
}

impl GgmlType {
    pub fn from_id(id: u32) -> GgmlType {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            15 => GgmlType::Q8K,
            20 => GgmlType::IQ4NL,
            23 => GgmlType::IQ4XS,
            24 => GgmlType::I8,
            25 => GgmlType::I16,
            26 => GgmlType::I32,
            27 => GgmlType::I64,
            28 => GgmlType::F64,
            30 => GgmlType::BF16,
            39 => GgmlType::MXFP4,
            other => GgmlType::Other(other),
        }
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::IQ4NL => 20,
            GgmlType::IQ4XS => 23,
            GgmlType::I8 => 24,
            GgmlType::I16 => 25,
            GgmlType::I32 => 26,
            GgmlType::I64 => 27,
            GgmlType::F64 => 28,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
            GgmlType::Other(id) => id,
        }
    }

    /// The name llama.cpp prints for this type (`Q4_K`, `BF16`, ...).
    pub fn name(self) -> String {
        match self {
            GgmlType::F32 => "F32".into(),
            GgmlType::F16 => "F16".into(),
            GgmlType::Q4_0 => "Q4_0".into(),
            GgmlType::Q4_1 => "Q4_1".into(),
            GgmlType::Q5_0 => "Q5_0".into(),
            GgmlType::Q5_1 => "Q5_1".into(),
            GgmlType::Q8_0 => "Q8_0".into(),
            GgmlType::Q8_1 => "Q8_1".into(),
            GgmlType::Q2K => "Q2_K".into(),
            GgmlType::Q3K => "Q3_K".into(),
            GgmlType::Q4K => "Q4_K".into(),
            GgmlType::Q5K => "Q5_K".into(),
            GgmlType::Q6K => "Q6_K".into(),
            GgmlType::Q8K => "Q8_K".into(),
            GgmlType::IQ4NL => "IQ4_NL".into(),
            GgmlType::IQ4XS => "IQ4_XS".into(),
            GgmlType::I8 => "I8".into(),
            GgmlType::I16 => "I16".into(),
            GgmlType::I32 => "I32".into(),
            GgmlType::I64 => "I64".into(),
            GgmlType::F64 => "F64".into(),
            GgmlType::BF16 => "BF16".into(),
            GgmlType::MXFP4 => "MXFP4".into(),
            GgmlType::Other(id) => match id {
                16 => "IQ2_XXS".into(),
                17 => "IQ2_XS".into(),
                18 => "IQ3_XXS".into(),
                19 => "IQ1_S".into(),
                21 => "IQ3_S".into(),
                22 => "IQ2_S".into(),
                29 => "IQ1_M".into(),
                34 => "TQ1_0".into(),
                35 => "TQ2_0".into(),
                _ => format!("ggml type {id}"),
            },
        }
    }

    /// `(elements per block, bytes per block)`, or `None` for types without a known layout.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        const QK_K: u64 = 256;
        Some(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q8_1 => (32, 36),
            GgmlType::Q2K => (QK_K, 84),
            GgmlType::Q3K => (QK_K, 110),
            GgmlType::Q4K => (QK_K, 144),
            GgmlType::Q5K => (QK_K, 176),
            GgmlType::Q6K => (QK_K, 210),
            GgmlType::Q8K => (QK_K, 292),
            GgmlType::IQ4NL => (32, 18),
            GgmlType::IQ4XS => (QK_K, 136),
            GgmlType::MXFP4 => (32, 17),
            GgmlType::I8 => (1, 1),
            GgmlType::I16 => (1, 2),
            GgmlType::I32 => (1, 4),
            GgmlType::I64 | GgmlType::F64 => (1, 8),
            GgmlType::Other(_) => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A typed GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetadataValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetadataValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any non-negative integer value, whatever its stored width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value, whatever its stored width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetadataValue::I8(v) => Some(v.into()),
            MetadataValue::I16(v) => Some(v.into()),
            MetadataValue::I32(v) => Some(v.into()),
            MetadataValue::I64(v) => Some(v),
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any numeric value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            // Integer metadata is small in practice; the precision loss above 2^53 is moot.
            #[allow(clippy::cast_precision_loss)]
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the contiguous (innermost) dimension, so a weight with
    /// `out_features` rows of `in_features` has `dims == [in_features, out_features]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the tensor's bytes relative to the start of the data section.
    pub offset: u64,
    /// Number of bytes of the tensor, from its type's block layout.
    pub size_bytes: u64,
}

impl TensorInfo {
    pub fn num_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}
