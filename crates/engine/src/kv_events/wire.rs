//! vLLM's wire format of one event batch: msgpack of msgspec's array-like structs,
//! `[ts, [event, ...], data_parallel_rank]`, each event a tagged array —
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
//! `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`.
//!
//! Block hashes go out as vLLM's integer form (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, the
//! default): the hash read as a big-endian integer, low 64 bits — for tokenmill's 128-bit
//! hash, its low 64 bits.

use std::io;

use rmp::encode;
use tokenmill_core::{BlockHash, KvCacheEvent};

/// Where the blocks live, as vLLM's block pool reports its own cache (`MEDIUM_GPU`, which
/// vLLM's CPU backend also sends): the engine's primary KV cache, not an offload tier.
pub const MEDIUM: &str = "GPU";

/// The external (integer) form of a block hash.
fn external_hash(hash: BlockHash) -> u64 {
    hash.0 as u64
}

/// Encodes one batch. `ts` is seconds since the Unix epoch.
pub fn encode_batch(ts: f64, events: &[KvCacheEvent], dp_rank: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + 16 * events.len());
    encode::write_array_len(&mut out, 3)?;
    encode::write_f64(&mut out, ts)?;
    write_len(&mut out, events.len())?;
    for event in events {
        write_event(&mut out, event)?;
    }
    encode::write_uint(&mut out, dp_rank as u64)?;
    Ok(out)
}

fn write_event(out: &mut Vec<u8>, event: &KvCacheEvent) -> io::Result<()> {
    match event {
        KvCacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
        } => {
            encode::write_array_len(out, 7)?;
            encode::write_str(out, "BlockStored")?;
            write_hashes(out, block_hashes)?;
            write_optional(out, parent_block_hash.map(external_hash))?;
            write_len(out, token_ids.len())?;
            for &token in token_ids {
                encode::write_uint(out, u64::from(token))?;
            }
            encode::write_uint(out, *block_size as u64)?;
            write_optional(out, lora_id.map(u64::from))?;
            encode::write_str(out, MEDIUM)?;
        }
        KvCacheEvent::BlockRemoved { block_hashes } => {
            encode::write_array_len(out, 3)?;
            encode::write_str(out, "BlockRemoved")?;
            write_hashes(out, block_hashes)?;
            encode::write_str(out, MEDIUM)?;
        }
        KvCacheEvent::AllBlocksCleared => {
            encode::write_array_len(out, 1)?;
            encode::write_str(out, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[BlockHash]) -> io::Result<()> {
    write_len(out, hashes.len())?;
    for &hash in hashes {
        encode::write_uint(out, external_hash(hash))?;
    }
    Ok(())
}

fn write_optional(out: &mut Vec<u8>, value: Option<u64>) -> io::Result<()> {
    match value {
        Some(value) => encode::write_uint(out, value).map(|_| ())?,
        None => encode::write_nil(out)?,
    }
    Ok(())
}

fn write_len(out: &mut Vec<u8>, len: usize) -> io::Result<()> {
    let len = u32::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "array too long"))?;
    encode::write_array_len(out, len)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rmpv::Value;

    use super::*;

    fn decode(bytes: &[u8]) -> Value {
        rmpv::decode::read_value(&mut &bytes[..]).unwrap()
    }

    #[test]
    fn batches_are_msgspec_array_like_tagged_structs() {
        let hash = BlockHash((7u128 << 64) | 0xdead_beef);
        let events = [
            KvCacheEvent::BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: None,
                token_ids: vec![1, 2, 70_000],
                block_size: 3,
                lora_id: None,
            },
            KvCacheEvent::BlockStored {
                block_hashes: vec![BlockHash(5)],
                parent_block_hash: Some(hash),
                token_ids: vec![4, 5, 6],
                block_size: 3,
                lora_id: Some(2),
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![hash, BlockHash(5)],
            },
            KvCacheEvent::AllBlocksCleared,
        ];
        let value = decode(&encode_batch(1.5, &events, 1).unwrap());
        let expected = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![0xdead_beef_u64.into()]),
                    Value::Nil,
                    Value::Array(vec![1u64.into(), 2u64.into(), 70_000u64.into()]),
                    3u64.into(),
                    Value::Nil,
                    "GPU".into(),
                ]),
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![5u64.into()]),
                    0xdead_beef_u64.into(),
                    Value::Array(vec![4u64.into(), 5u64.into(), 6u64.into()]),
                    3u64.into(),
                    2u64.into(),
                    "GPU".into(),
                ]),
                Value::Array(vec![
                    "BlockRemoved".into(),
                    Value::Array(vec![0xdead_beef_u64.into(), 5u64.into()]),
                    "GPU".into(),
                ]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
            1u64.into(),
        ]);
        assert_eq!(value, expected);
    }
}
