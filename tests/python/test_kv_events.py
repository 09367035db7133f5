"""KV-cache events of a live `tokenmill serve`, read the way vLLM's own consumers read them:
pyzmq SUB + DEALER sockets and msgspec's array-like tagged structs (the decoding side of
vLLM's `kv_events` wire format), with the raw frames checked by plain msgpack too.

After requests with a shared prefix every `BlockStored` carries its tokens and a parent chain
that rebuilds each prompt; a small KV cache turns further requests into `BlockRemoved`; a
subscriber that joins late replays the buffer and then follows live with no gap.
"""

from __future__ import annotations

import json
import socket
import time

import msgpack
import msgspec
import zmq

from conftest import MODEL_NAME, start_server, stop_server

BLOCK = 16
TOPIC = "kv@pod-a@tm-test"


# The consumer-side schema of the wire format (vLLM's field order and tags).
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def subscribe(context: zmq.Context, port: int) -> zmq.Socket:
    sub = context.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt_string(zmq.SUBSCRIBE, "kv@pod-a")
    time.sleep(0.5)  # the subscription must reach the publisher first
    return sub


def receive(sub: zmq.Socket, quiet_ms: int = 1000) -> list[tuple[int, KVEventBatch]]:
    """Everything published until the socket stays quiet for `quiet_ms`."""
    received = []
    while sub.poll(quiet_ms):
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode()
        raw = msgpack.unpackb(payload)
        assert isinstance(raw, list) and len(raw) == 3, raw
        received.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    return received


def replay(context: zmq.Context, port: int, start: int) -> list[tuple[int, KVEventBatch]]:
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    received = []
    try:
        while True:
            assert dealer.poll(5000), "replay answered"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            number = int.from_bytes(seq, "big", signed=True)
            if number == -1:
                assert payload == b""
                return received
            received.append((number, DECODER.decode(payload)))
    finally:
        dealer.close(linger=0)


class View:
    """What a prefix-cache-aware router knows: hash -> (parent, the block's tokens)."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[int | None, list[int]]] = {}
        self.removed: list[int] = []

    def apply(self, batch: KVEventBatch) -> None:
        assert batch.data_parallel_rank == 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert event.block_size == BLOCK and event.medium == "GPU"
                assert event.lora_id is None
                assert len(event.token_ids) == BLOCK * len(event.block_hashes), "full blocks only"
                parent = event.parent_block_hash
                for i, block_hash in enumerate(event.block_hashes):
                    self.blocks[block_hash] = (parent, event.token_ids[i * BLOCK : (i + 1) * BLOCK])
                    parent = block_hash
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    assert self.blocks.pop(block_hash, None) is not None, "removed an unknown block"
                    self.removed.append(block_hash)
            else:
                self.blocks.clear()

    def chain(self, block_hash: int) -> tuple[list[int], list[int]]:
        """(hashes root first, tokens) of the chain ending at `block_hash`."""
        hashes, tokens = [], []
        at: int | None = block_hash
        while at is not None:
            parent, block_tokens = self.blocks[at]
            hashes.insert(0, at)
            tokens[:0] = block_tokens
            at = parent
        return hashes, tokens

    def find(self, prompt: list[int]) -> list[int]:
        """The hashes of the chain whose tokens are exactly `prompt`."""
        for block_hash in self.blocks:
            hashes, tokens = self.chain(block_hash)
            if tokens == prompt:
                return hashes
        raise AssertionError(f"no chain rebuilds {prompt}")


def complete(client, prompt: list[int]) -> None:
    client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0)


def test_events_rebuild_prefixes_show_evictions_and_replay_without_gaps():
    pub_port, replay_port = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": TOPIC,
        "buffer_steps": 10000,
        "hwm": 100000,
    }
    # About 17 blocks of 16 tokens: a handful of long prompts must evict. The budget is sized for
    # f32 K/V, so the element type is named (auto stores f16, which would double the blocks).
    server = start_server(
        "--kv-events-config", json.dumps(config), "--kv-cache-memory", "24MiB", "--max-model-len", "256",
        "--kv-cache-dtype", "float32",
    )
    context = zmq.Context()
    try:
        client = server.client()
        early = subscribe(context, pub_port)
        shared = [400 + 7 * i for i in range(32)]
        first = shared + [900 + i for i in range(16)]
        second = shared + [1500 + 3 * i for i in range(16)]
        for prompt in (first, second):
            complete(client, prompt)
        received = receive(early)
        view = View()
        for _, batch in received:
            view.apply(batch)
        first_chain, second_chain = view.find(first), view.find(second)
        assert len(first_chain) == len(second_chain) == 3
        assert first_chain[:2] == second_chain[:2], "the shared prefix is one chain"
        assert first_chain[2] != second_chain[2]

        for r in range(6):
            complete(client, [3000 + 500 * r + i for i in range(100)])
        more = receive(early)
        for _, batch in more:
            view.apply(batch)
        received += more
        assert view.removed, "evictions are published as BlockRemoved"
        assert [seq for seq, _ in received] == list(range(len(received))), "no gap"

        late = subscribe(context, pub_port)
        replayed = replay(context, replay_port, 0)
        assert [seq for seq, _ in replayed] == [seq for seq, _ in received]
        assert [batch for _, batch in replayed] == [batch for _, batch in received]
        complete(client, [7000 + i for i in range(40)])
        live = receive(late)
        assert live and live[0][0] == len(received), "live follows the replay with no gap"
        late_view = View()
        for _, batch in replayed + live:
            late_view.apply(batch)
        for _, batch in receive(early):
            view.apply(batch)
        assert late_view.blocks == view.blocks

        assert server.metrics().get("tokenmill_kv_events_dropped_total", 0.0) == 0.0
        early.close(linger=0)
        late.close(linger=0)
    finally:
        # destroy, not term: after a failed assertion the sockets are still open, and term()
        # would wait for them forever instead of letting the failure show.
        context.destroy(linger=0)
        stop_server(server)
