//! Reader against the writer, against a hand-made corrupt header, and against the real model.

use std::path::PathBuf;

use tokenmill_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetadataValue};

fn sample() -> GgufWriter {
    let mut writer = GgufWriter::new();
    writer
        .add_metadata(
            "general.architecture",
            MetadataValue::String("llama".into()),
        )
        .add_metadata("llama.block_count", MetadataValue::U32(2))
        .add_metadata("llama.rope.freq_base", MetadataValue::F32(10000.0))
        .add_metadata("general.flag", MetadataValue::Bool(true))
        .add_metadata("signed", MetadataValue::I64(-3))
        .add_metadata(
            "tokenizer.ggml.tokens",
            MetadataValue::Array(vec![
                MetadataValue::String("a".into()),
                MetadataValue::String("é🙂".into()),
            ]),
        )
        .add_f32_tensor("a", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .add_f32_tensor("b", &[1], &[7.5])
        .add_tensor("q", &[32], GgmlType::Q8_0, vec![9u8; 34]);
    writer
}

#[test]
fn writer_output_reads_back() {
    let file = GgufFile::from_bytes(sample().to_bytes()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(file.get_u64("llama.block_count"), Some(2));
    assert_eq!(file.get_f64("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(file.get_bool("general.flag"), Some(true));
    assert_eq!(file.get_u64("signed"), None);
    assert_eq!(file.get("signed").and_then(MetadataValue::as_i64), Some(-3));
    let tokens = file.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens[1].as_str(), Some("é🙂"));

    let a = file.tensor("a").unwrap();
    assert_eq!(a.dims, vec![3, 2]);
    assert_eq!(a.num_elements(), 6);
    let bytes = file.tensor_data(a).unwrap();
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(values, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = file.tensor("b").unwrap();
    assert_eq!(b.offset % 32, 0);
    assert_eq!(file.tensor_data(b).unwrap(), 7.5f32.to_le_bytes());
    let q = file.tensor("q").unwrap();
    assert_eq!(q.size_bytes, 34);
    assert_eq!(file.tensor_data(q).unwrap(), vec![9u8; 34]);
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample().to_bytes();
    for len in 0..bytes.len() - 1 {
        assert!(
            GgufFile::from_bytes(bytes[..len].to_vec()).is_err(),
            "prefix of {len} bytes parsed"
        );
    }
}

#[test]
fn bad_magic_version_and_type_are_named() {
    let mut bytes = sample().to_bytes();
    bytes[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::BadMagic(_))
    ));

    let mut bytes = sample().to_bytes();
    bytes[4] = 1;
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::UnsupportedVersion(1))
    ));

    let mut writer = GgufWriter::new();
    writer.add_tensor("w", &[32], GgmlType::Other(16), vec![0; 66]);
    let err = GgufFile::from_bytes(writer.to_bytes()).unwrap_err();
    assert!(err.to_string().contains("IQ2_XXS"), "{err}");
}

#[test]
fn inner_dimension_must_fill_whole_blocks() {
    let mut writer = GgufWriter::new();
    writer.add_tensor("w", &[31], GgmlType::Q4_0, vec![0; 18]);
    let err = GgufFile::from_bytes(writer.to_bytes()).unwrap_err();
    assert!(err.to_string().contains("block size 32"), "{err}");
}

fn default_model() -> PathBuf {
    if let Ok(path) = std::env::var("TOKENMILL_TEST_MODEL") {
        return PathBuf::from(path);
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let path = PathBuf::from(home).join(".cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "default model missing at {}: run scripts/fetch-model.sh (or set TOKENMILL_TEST_MODEL)",
        path.display()
    );
    path
}

#[test]
fn reads_the_default_model() {
    let file = GgufFile::open(&default_model()).unwrap();
    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(file.get_u64("llama.block_count"), Some(30));
    assert_eq!(file.get_u64("llama.embedding_length"), Some(576));
    assert_eq!(file.get_u64("llama.attention.head_count"), Some(9));
    assert_eq!(file.get_u64("llama.attention.head_count_kv"), Some(3));
    assert_eq!(
        file.get_array("tokenizer.ggml.tokens").map(<[_]>::len),
        Some(49152)
    );
    let embedding = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embedding.dims, vec![576, 49152]);
    assert_eq!(embedding.ggml_type, GgmlType::Q8_0);
    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ggml_type, GgmlType::Q4_1);
    assert_eq!(
        file.tensor_data(q).unwrap().len() as u64,
        576 * 576 / 32 * 20
    );
    // Every tensor's bytes are reachable.
    for info in file.tensors() {
        file.tensor_data(info).unwrap();
    }
}

#[test]
fn iq4_layouts_are_known() {
    // IQ4_NL: 18 bytes per 32; IQ4_XS: 136 bytes per 256 (the compute layer reads both).
    let mut writer = GgufWriter::new();
    writer.add_tensor("nl", &[64, 2], GgmlType::from_id(20), vec![0; 4 * 18]);
    writer.add_tensor("xs", &[256], GgmlType::from_id(23), vec![0; 136]);
    let file = GgufFile::from_bytes(writer.to_bytes()).unwrap();
    let nl = file.tensor("nl").unwrap();
    assert_eq!((nl.ggml_type, nl.size_bytes), (GgmlType::IQ4NL, 72));
    let xs = file.tensor("xs").unwrap();
    assert_eq!((xs.ggml_type, xs.size_bytes), (GgmlType::IQ4XS, 136));
    assert_eq!(GgmlType::IQ4XS.name(), "IQ4_XS");
}

#[test]
fn mxfp4_layout_is_known() {
    // MXFP4 (gpt-oss's experts): 17 bytes per 32, a 3-D expert tensor's size from its blocks.
    let mut writer = GgufWriter::new();
    writer.add_tensor(
        "exps",
        &[64, 3, 4],
        GgmlType::from_id(39),
        vec![7; 4 * 3 * 2 * 17],
    );
    let file = GgufFile::from_bytes(writer.to_bytes()).unwrap();
    let exps = file.tensor("exps").unwrap();
    assert_eq!((exps.ggml_type, exps.size_bytes), (GgmlType::MXFP4, 408));
    assert_eq!(file.tensor_data(exps).unwrap(), &[7; 408][..]);
    assert_eq!(GgmlType::MXFP4.name(), "MXFP4");
    assert_eq!(GgmlType::MXFP4.id(), 39);
}

/// A tensor kept as `TensorBytes` reads the same bytes as `tensor_data`, and stays readable
/// after the file it came from is dropped (the memory map lives as long as it does).
#[test]
fn tensor_bytes_outlive_their_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.gguf");
    let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.5).collect();
    let mut writer = GgufWriter::new();
    writer.add_f32_tensor("table", &[16, 4], &values);
    writer.write_to(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let info = file.tensor("table").unwrap().clone();
    let kept = file.tensor_bytes(&info).unwrap();
    assert_eq!(kept.as_slice(), file.tensor_data(&info).unwrap());
    drop(file);
    let read: Vec<f32> = kept
        .as_slice()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(read, values);
}
