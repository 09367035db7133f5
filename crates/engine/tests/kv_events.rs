//! KV-cache events from a live engine over the real model, read by ZeroMQ subscribers the way
//! a prefix-aware router reads vLLM's: every `BlockStored` names the right tokens and a parent
//! chain that rebuilds the request's sequence, evictions come as `BlockRemoved`, and a
//! subscriber that joins late replays the buffer with no gap in sequence numbers.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{config, greedy, run_all, wait_idle};
use rmpv::Value;
use tokenmill_core::{BlockHashChain, BlockHashExtraKeys};
use tokenmill_engine::kv_events::KvEventsConfig;
use tokenmill_engine::Engine;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const BLOCK: usize = 16;
const TOPIC: &str = "kv@pod-0@tm-test";

#[allow(clippy::unwrap_used)]
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One received message: its sequence number and decoded `[ts, events, dp_rank]`.
#[derive(Debug, Clone, PartialEq)]
struct Received {
    seq: i64,
    batch: Value,
}

#[allow(clippy::unwrap_used, clippy::panic)]
fn decode(seq: &[u8], payload: &[u8]) -> Received {
    let seq = i64::from_be_bytes(seq.try_into().unwrap());
    let batch = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    Received { seq, batch }
}

#[allow(clippy::unwrap_used)]
async fn subscribe(port: u16) -> SubSocket {
    let mut socket = SubSocket::new();
    socket
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    socket.subscribe("kv@pod-0").await.unwrap();
    // Let the subscription reach the publisher before anything is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    socket
}

/// Everything the subscriber receives until it has been quiet for a while.
#[allow(clippy::unwrap_used)]
async fn drain(socket: &mut SubSocket) -> Vec<Received> {
    let mut received = Vec::new();
    while let Ok(Ok(message)) =
        tokio::time::timeout(Duration::from_millis(700), socket.recv()).await
    {
        let frames = message.into_vec();
        assert_eq!(frames.len(), 3, "[topic, seq, payload]");
        assert_eq!(&frames[0][..], TOPIC.as_bytes());
        received.push(decode(&frames[1], &frames[2]));
    }
    received
}

/// Asks the replay socket for everything from `start`, up to the end marker.
#[allow(clippy::unwrap_used)]
async fn replay(port: u16, start: u64) -> Vec<Received> {
    let mut socket = DealerSocket::new();
    socket
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let mut request = ZmqMessage::from(Vec::<u8>::new());
    request.push_back(start.to_be_bytes().to_vec().into());
    socket.send(request).await.unwrap();
    let mut received = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), socket.recv())
            .await
            .unwrap()
            .unwrap();
        let frames = message.into_vec();
        assert_eq!(frames.len(), 3, "[\"\", seq, payload]");
        assert!(frames[0].is_empty());
        if frames[1][..] == (-1i64).to_be_bytes() {
            assert!(frames[2].is_empty(), "the end marker has no payload");
            return received;
        }
        received.push(decode(&frames[1], &frames[2]));
    }
}

/// A block as a subscriber learns it from `BlockStored`.
#[derive(Debug, Clone, PartialEq)]
struct StoredBlock {
    parent: Option<u64>,
    token_ids: Vec<u64>,
}

#[derive(Debug, Default)]
struct Subscriber {
    blocks: HashMap<u64, StoredBlock>,
    removed: Vec<u64>,
    /// The data-parallel rank every batch must name.
    dp_rank: u64,
}

#[allow(clippy::unwrap_used, clippy::panic)]
fn as_u64s(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

impl Subscriber {
    #[allow(clippy::unwrap_used, clippy::panic)]
    fn apply(&mut self, received: &Received) {
        let batch = received.batch.as_array().unwrap();
        assert_eq!(batch.len(), 3, "[ts, events, dp_rank]");
        assert!(batch[0].as_f64().unwrap() > 1.0e9, "a Unix timestamp");
        assert_eq!(batch[2].as_u64(), Some(self.dp_rank), "dp_rank");
        for event in batch[1].as_array().unwrap() {
            let fields = event.as_array().unwrap();
            match fields[0].as_str().unwrap() {
                "BlockStored" => {
                    assert_eq!(fields.len(), 7);
                    let hashes = as_u64s(&fields[1]);
                    let tokens = as_u64s(&fields[3]);
                    assert_eq!(fields[4].as_u64(), Some(BLOCK as u64), "block_size");
                    assert!(fields[5].is_nil(), "lora_id");
                    assert_eq!(fields[6].as_str(), Some("GPU"), "medium");
                    assert_eq!(tokens.len(), hashes.len() * BLOCK, "only full blocks");
                    let mut parent = fields[2].as_u64();
                    for (hash, chunk) in hashes.iter().zip(tokens.chunks(BLOCK)) {
                        let block = StoredBlock {
                            parent,
                            token_ids: chunk.to_vec(),
                        };
                        self.blocks.insert(*hash, block);
                        parent = Some(*hash);
                    }
                }
                "BlockRemoved" => {
                    assert_eq!(fields.len(), 3);
                    assert_eq!(fields[2].as_str(), Some("GPU"));
                    for hash in as_u64s(&fields[1]) {
                        assert!(
                            self.blocks.remove(&hash).is_some(),
                            "removed unknown {hash}"
                        );
                        self.removed.push(hash);
                    }
                }
                "AllBlocksCleared" => self.blocks.clear(),
                other => panic!("unknown event {other}"),
            }
        }
    }

    /// Follows the parent chain from `last` back to a root and returns the tokens in order.
    fn chain_tokens(&self, last: u64) -> Vec<u64> {
        let mut blocks = Vec::new();
        let mut at = Some(last);
        while let Some(hash) = at {
            let block = &self.blocks[&hash];
            blocks.push(block.token_ids.clone());
            at = block.parent;
        }
        blocks.into_iter().rev().flatten().collect()
    }
}

/// tokenmill's block hashes of `sequence` in their external (low 64-bit) form.
fn external_hashes(sequence: &[u32]) -> Vec<u64> {
    let mut chain = BlockHashChain::new(BLOCK, BlockHashExtraKeys::default());
    chain.extend(sequence);
    chain.hashes().iter().map(|hash| hash.0 as u64).collect()
}

/// Checks that the subscriber knows every computed full block of `sequence` (prompt plus
/// output, whose last token was sampled but not computed) and that the chain rebuilds it.
#[allow(clippy::unwrap_used)]
fn assert_sequence_known(subscriber: &Subscriber, sequence: &[u32]) {
    let hashes = external_hashes(&sequence[..sequence.len() - 1]);
    assert!(!hashes.is_empty());
    let last = *hashes.last().unwrap();
    let expected: Vec<u64> = sequence[..hashes.len() * BLOCK]
        .iter()
        .map(|&t| u64::from(t))
        .collect();
    assert_eq!(subscriber.chain_tokens(last), expected);
    for (i, hash) in hashes.iter().enumerate() {
        let block = &subscriber.blocks[hash];
        assert_eq!(block.parent, i.checked_sub(1).map(|p| hashes[p]));
    }
}

#[test]
#[allow(clippy::unwrap_used)]
fn a_router_rebuilds_prefixes_sees_evictions_and_replays_without_gaps() {
    let (pub_port, replay_port) = (free_port(), free_port());
    let mut engine_config = config(12, 128);
    engine_config.served_model_name = "tm-test".into();
    engine_config.kv_events = Some(
        KvEventsConfig::parse(&format!(
            r#"{{"enable_kv_cache_events": true, "publisher": "zmq",
                "endpoint": "tcp://*:{pub_port}", "replay_endpoint": "tcp://*:{replay_port}",
                "topic": "{TOPIC}", "buffer_steps": 10000, "hwm": 100000}}"#
        ))
        .unwrap(),
    );
    let engine = Engine::start(&engine_config).unwrap();
    let client = engine.client();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut early = runtime.block_on(subscribe(pub_port));

    // Two requests sharing a 32-token prefix, one after the other.
    let shared: Vec<u32> = (0..32).map(|i| 400 + i * 7).collect();
    let mut first = shared.clone();
    first.extend((0..10).map(|i| 900 + i));
    let mut second = shared.clone();
    second.extend((0..20).map(|i| 1500 + i * 3));
    let mut sequences = Vec::new();
    for prompt in [first, second] {
        let output = run_all(&client, vec![greedy(prompt.clone(), 8)]).remove(0);
        sequences.push([prompt, output.token_ids].concat());
    }
    wait_idle(&client);
    let mut received = runtime.block_on(drain(&mut early));
    let mut subscriber = Subscriber::default();
    for item in &received {
        subscriber.apply(item);
    }
    for sequence in &sequences {
        assert_sequence_known(&subscriber, sequence);
    }
    // The shared blocks were stored once: the second request hit them.
    let shared_hashes = external_hashes(&shared);
    assert_eq!(external_hashes(&sequences[1])[..2], shared_hashes[..]);

    // Distinct prompts overflow the 12-block pool: cached blocks are evicted.
    let others: Vec<Vec<u32>> = (0..4)
        .map(|r| (0..60).map(|i| 3000 + r * 500 + i).collect())
        .collect();
    run_all(&client, others.into_iter().map(|p| greedy(p, 4)).collect());
    wait_idle(&client);
    let more = runtime.block_on(drain(&mut early));
    for item in &more {
        subscriber.apply(item);
    }
    received.extend(more);
    assert!(
        !subscriber.removed.is_empty(),
        "evictions give BlockRemoved"
    );
    let seqs: Vec<i64> = received.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..seqs.len() as i64).collect::<Vec<_>>(), "no gap");

    // A late subscriber replays from 0, then keeps up live from the next number.
    let mut late = runtime.block_on(subscribe(pub_port));
    let replayed = runtime.block_on(replay(replay_port, 0));
    assert_eq!(replayed, received, "the replay is what was published");
    let tail = runtime.block_on(replay(replay_port, 3));
    assert_eq!(tail[..], received[3..]);
    run_all(
        &client,
        vec![greedy((0..40).map(|i| 7000 + i).collect(), 4)],
    );
    wait_idle(&client);
    let live = runtime.block_on(drain(&mut late));
    assert!(!live.is_empty());
    assert_eq!(
        live[0].seq,
        received.len() as i64,
        "live picks up after the replay"
    );
    let mut rebuilt = Subscriber::default();
    for item in replayed.iter().chain(&live) {
        rebuilt.apply(item);
    }
    for item in &live {
        subscriber.apply(item);
    }
    assert_eq!(
        rebuilt.blocks, subscriber.blocks,
        "the late view equals the early one"
    );
    assert_eq!(
        runtime.block_on(drain(&mut early)),
        live,
        "both subscribers see the same stream"
    );
}

/// A port `p` with `p + 1` free as well (rank 1 publishes on the next port).
#[allow(clippy::unwrap_used)]
fn free_port_pair(avoid: &[u16]) -> u16 {
    loop {
        let port = free_port();
        let next = port.checked_add(1);
        let taken = |p: u16| avoid.iter().any(|&a| a == p || a + 1 == p);
        if let Some(next) = next.filter(|&n| !taken(port) && !taken(n)) {
            if std::net::TcpListener::bind(("127.0.0.1", next)).is_ok() {
                return port;
            }
        }
    }
}

#[test]
#[allow(clippy::unwrap_used)]
fn each_data_parallel_rank_publishes_its_own_blocks_on_its_own_port() {
    let pub_port = free_port_pair(&[]);
    let replay_port = free_port_pair(&[pub_port]);
    let mut engine_config = config(32, 128);
    engine_config.data_parallel_size = 2;
    engine_config.num_threads = Some(2);
    engine_config.kv_events = Some(
        KvEventsConfig::parse(&format!(
            r#"{{"enable_kv_cache_events": true, "publisher": "zmq",
                "endpoint": "tcp://*:{pub_port}", "replay_endpoint": "tcp://*:{replay_port}",
                "topic": "{TOPIC}"}}"#
        ))
        .unwrap(),
    );
    let engine = Engine::start(&engine_config).unwrap();
    let client = engine.client();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut sockets = [
        runtime.block_on(subscribe(pub_port)),
        runtime.block_on(subscribe(pub_port + 1)),
    ];
    // Submitted together: the first prompt runs on engine 0, the second on engine 1.
    let prompts: Vec<Vec<u32>> = (0..2)
        .map(|r| (0..40).map(|i| 2000 + r * 300 + i).collect())
        .collect();
    let outputs = run_all(
        &client,
        prompts.iter().map(|p| greedy(p.clone(), 4)).collect(),
    );
    wait_idle(&client);
    for (rank, socket) in sockets.iter_mut().enumerate() {
        let received = runtime.block_on(drain(socket));
        assert!(!received.is_empty(), "rank {rank} published");
        let mut subscriber = Subscriber {
            dp_rank: rank as u64,
            ..Subscriber::default()
        };
        for item in &received {
            subscriber.apply(item);
        }
        let sequence = [prompts[rank].clone(), outputs[rank].token_ids.clone()].concat();
        assert_sequence_known(&subscriber, &sequence);
        let other = external_hashes(&prompts[1 - rank]);
        assert!(
            other
                .iter()
                .all(|hash| !subscriber.blocks.contains_key(hash)),
            "rank {rank} holds none of the other engine's blocks"
        );
    }
}
