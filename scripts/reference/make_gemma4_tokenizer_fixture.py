#!/usr/bin/env python3
"""Writes crates/text/tests/fixtures/tokenizer_gemma4_{synthetic,vocab}.json: llama.cpp's ids and
text for Gemma 4's tokenizer model ("gemma4": BPE over raw UTF-8, spaces as "▁", <0xXX> byte
fallback) on two vocabularies.

- synthetic: a small vocabulary of Gemma 4's kind made the way a real file is made. A BPE model
  is trained with `tokenizers` on a fixed corpus and laid out as Gemma 4's tokenizer.json lays
  its vocabulary out (control tokens first, the turn, tool and channel markers, runs of
  newlines, tabs and "▁" with every split of a run as a merge, longest runs first, the 256 byte
  tokens, the trained pieces, the media markers last); llama.cpp's own converter then writes
  its vocabulary (`Gemma4Model.set_vocab` from conversion/gemma.py, with transformers'
  AutoTokenizer behind gguf-py's LlamaHfVocab) into a GGUF whose other keys are copied from
  the real vocabulary file. One newline run ("\n" * 12) is a token no merge builds, as
  llama.cpp's newline-run rule needs. The fixture keeps the tokenizer.* keys as written, so
  the Rust test rebuilds the GGUF without Python.
- vocab: Gemma 4's real tokenizer, llama.cpp's models/ggml-vocab-gemma-4.gguf
  (scripts/fetch-gemma4-vocab.sh fetches it for the Rust test); the fixture keeps ids only.

For each text, llama.cpp (llama-cpp-python 0.3.36, vendored llama.cpp 0c1e570,
Llama(vocab_only=True)) gives `tokenize(add_bos=True, special=True)` (the script checks that
add_bos=False gives the same ids without BOS) and the text of those ids as llama.cpp's server
writes it: the concatenated `llama_token_to_piece` of each id, without special tokens (`text`)
and with them (`text_special`). (`llama_detokenize` would also apply its clean-up of spaces
before punctuation, which Gemma 4's BPE vocabulary turns on; the server does not use it for
generated text and it does not round-trip, so it is not recorded.) Per vocabulary it also
records the end-of-generation ids (`llama_vocab_is_eog`) and the ids whose piece is empty
without special tokens (`hidden`). The texts: hand-written cases (whitespace runs, code,
scripts, emoji, Gemma 4's chat and tool-call markup, special tokens inside words), llama.cpp's
own test inputs for this vocabulary (models/ggml-vocab-gemma-4.gguf.inp) and seeded random
mixtures of all of those pieces.

Run with the torch venv (transformers, tokenizers, torch for the converter's imports),
`--llama-python` a Python with llama-cpp-python==0.3.36, `--llama-cpp` the sdist's
`vendor/llama.cpp`:
    .cache/torch-venv/bin/python scripts/reference/make_gemma4_tokenizer_fixture.py \\
        --llama-python .cache/llama-venv/bin/python \\
        --llama-cpp .cache/ref/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
"""

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import types
from pathlib import Path

FIXTURES = os.path.join(os.path.dirname(__file__), "../../crates/text/tests/fixtures")

CONTROL_FIRST = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
NORMAL_MARKERS = ["[multimodal]", "<unused0>", "<unused1>", "<unused2>"]
# The turn, tool, thinking and channel markers; the converter makes the tool-call, tool-response,
# string and channel ones user-defined.
MARKERS = [
    "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
    '<|"|>', "<|think|>", "<|channel>", "<channel|>", "<|turn>", "<turn|>",
]
MEDIA_LAST = ["<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>"]
# Ordinary tokens in Gemma 4 that llama.cpp's end-of-generation rules look at.
ORDINARY = ["<s>", "</s>"]
RUNS = {"\n": 8, "\t": 4, "\u2581": 8}
UNREACHABLE_NEWLINES = "\n" * 12

CORPUS = """
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun while the fox runs away.
Tokenizers split text into pieces; the pieces are tokens and every token has an id.
Once upon a time there was a small model that wanted to serve many requests at the same time.
It learned to batch its work, to page its cache and to stream tokens back to every user.
In 2024 the model served 1,234,567 requests at 3.14 ms per token, 99.9% of them on time.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

fn main() {
    let values: Vec<u32> = (0..10).map(|x| x * x).collect();
    println!("{:?}", values);
}
Le renard brun saute par-dessus le chien paresseux. Der schnelle Fuchs springt über den Hund.
Café, naïve, résumé, façade and Straße are words with accents; so is São Paulo.
{"name": "tokenmill", "tags": ["fast", "safe"], "count": 42, "nested": {"ok": true}}
## A heading

- a list item with **bold** text and a [link](https://example.com/path?q=1&r=2)
- another item, with `inline code` and an emoji 🙂
Привет мир! Γειά σου Κόσμε! 你好，世界！ こんにちは世界 안녕하세요
The weather in Paris is sunny; the weather in London is rainy; the weather is nice.
"""

HAND_CASES = [
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\n\n\n\n\n\n\n\n",
    "\n" * 9,
    "\n" * 12,
    "\n" * 13,
    "\n" * 31,
    "\n" * 32,
    "\n" * 40,
    " " * 8,
    " " * 9,
    " " * 31,
    " " * 40,
    "\t",
    "\t\t\t\t\t",
    "\t" * 33,
    " \n \n\t \t\n",
    "\r\n\r\n",
    "Hello world",
    " Hello world",
    "Hello World!",
    "Hello, world! How are you doing today?",
    "  leading spaces\n\n\n\ttabs\t\tand   multiple    spaces   \n  trailing  ",
    "The capital of France is",
    "Café naïve façade résumé — Zürich über Straße",
    "I love 🦀 Rust and 🐍 Python! 👍🏽 👨‍👩‍👧‍👦",
    "你好，世界！日本語のテキストです。한국어 문장입니다.",
    "Привет мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם हिन्दी ไทย",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}',
    "In 2024, 3.14159 * 1000000 = 3141590.0 and 1,234,567",
    "0123456789 00 000 0000",
    '{"name": "tokenmill", "tags": ["fast", "safe"], "n": 42}',
    "## Title\n\n- item **bold** [link](https://example.com/path?q=1&r=2)\n",
    "∀x ∈ ℝ: x² ≥ 0 → √(x²) = |x| ±∞ ≈ ≠ ≤",
    "aaaaaaaaaaaaaaaaaaaa!!!!!!!!??????..........",
    "e\u0301 a\u0308 \u00e9 zero\u200bwidth \ufeffbom",
    "\x00\x01\x1f\x7f control bytes",
    "a literal \u2581 lower block, <0x41> and <0xZZ>",
    "I'm sure they'll say it's what we've done, isn't it? a . b , c ! d ?",
    "<bos>",
    "<bos><bos>hello",
    "<eos>",
    "<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n",
    "<|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\nThe user greets.<channel|>Hello!<turn|>",
    '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|><|tool_response>',
    "<|tool>declaration:get_weather{description:<|\"|>The weather<|\"|>}<tool|>",
    "<|think|>",
    "</s> and <s> are ordinary here",
    "<unused0> [multimodal] <unused2>",
    "<|image> <|image|> <image|> <|audio> <|video|>",
    "x<|turn>y<turn|>z",
    "<|turn<turn|>|>",
    "<|turn><turn|><|turn>",
    "<|tool_response>user<|tool_response",
    "unterminated <|turn and <turn| and <|\"| markers",
    "🎉🎉🎉 emoji only 😀😃😄😁",
    "    indented = {'key': [1, 2, 3]}  # comment\n\treturn x**2 // 3",
    "The weather in Paris is sunny; the weather in London is rainy.",
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "Tabs\tand\r\nwindows\r\nnewlines   \r\n",
    "\n \n  \t \u3000x  \u00a0y\t\n",
]

RANDOM_PIECES = [
    " ", "  ", "    ", "\n", "\n\n", "\n\n\n", "\n" * 12, "\t", "\t\t", "\r\n", "\u2581", "\u00a0",
    "the", "The", " the", "weather", " Paris", "tokens", "fox", "model", "naïve", "Straße",
    "你好", "世界", "日本語", "한국어", "Привет", "مرحبا", "हिन्दी", "🦀", "👍🏽", "👨‍👩‍👧‍👦", "🙂",
    "0", "42", "3.14", "1,234", "(", ")", "{", "}", "[", "]", ";", ":", ",", ".", "!", "?", "'",
    '"', "->", "==", "//", "#", "*", "**", "e\u0301", "\u200b",
    "<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>",
    "<tool_call|>", "<|tool_response>", '<|"|>', "<|think|>", "</s>", "<s>", "<unused1>", "<|turn",
    "turn|>", "<0x41>",
]


def random_cases(seed: int, count: int) -> list:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        n = rng.randint(1, 12)
        cases.append("".join(rng.choice(RANDOM_PIECES) for _ in range(n)))
    return cases


def llama_cpp_inputs(llama_cpp: str) -> list:
    path = os.path.join(llama_cpp, "models/ggml-vocab-gemma-4.gguf.inp")
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n__ggml_vocab_test__\n")[:-1]


def all_texts(llama_cpp: str) -> list:
    texts = []
    for text in HAND_CASES + llama_cpp_inputs(llama_cpp) + random_cases(4, 100):
        if text not in texts:
            texts.append(text)
    return texts


# -- the synthetic vocabulary (torch venv) ---------------------------------------------------


def whitespace_runs():
    """Gemma 4's whitespace tokens and merges: runs up to RUNS[c] long; every split of a run is
    a merge, longer runs first, then longer left halves, the three characters interleaved."""
    tokens = {c: [c * k for k in range(1, RUNS[c] + 1)] for c in RUNS}
    merges = []
    for length in range(max(RUNS.values()), 1, -1):
        for left in range(length - 1, 0, -1):
            for c in ("\u2581", "\t", "\n"):
                if length <= RUNS[c]:
                    merges.append([c * left, c * (length - left)])
    return tokens, merges


def train_pieces():
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    # Words with their "▁", as Gemma 4's pieces are; whitespace stays out of the training.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(
        Regex("\u2581?[^\u2581\\s]+"), behavior="isolated", invert=False
    )
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False, min_frequency=2)
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines * 3, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    pieces = [t for t, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, list) else m.split(" ", 1) for m in model["merges"]]
    # Whitespace is the runs' business (write_hf_dir).
    blank = lambda text: all(c.isspace() or c == "\u2581" for c in text)  # noqa: E731
    pieces = [p for p in pieces if not blank(p)]
    merges = [m for m in merges if not blank(m[0] + m[1])]
    return pieces, merges


def write_hf_dir(path: Path) -> None:
    runs, run_merges = whitespace_runs()
    pieces, merges = train_pieces()
    vocab = []
    vocab += CONTROL_FIRST + NORMAL_MARKERS + MARKERS
    vocab += runs["\n"] + runs["\t"] + runs["\u2581"] + [UNREACHABLE_NEWLINES]
    vocab += [f"<0x{b:02X}>" for b in range(256)]
    vocab += ORDINARY
    vocab += [p for p in pieces if p not in vocab]
    vocab += MEDIA_LAST
    ids = {token: i for i, token in enumerate(vocab)}
    assert len(ids) == len(vocab), "duplicate token"
    merges = [m for m in run_merges + merges if m[0] in ids and m[1] in ids and m[0] + m[1] in ids]
    special = CONTROL_FIRST + MARKERS + MEDIA_LAST
    added = [
        {"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": t in special}
        for t in CONTROL_FIRST + NORMAL_MARKERS + MARKERS + MEDIA_LAST
    ]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [ids["<bos>"]], "tokens": ["<bos>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": ids, "merges": merges,
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
        "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False,
        "extra_special_tokens": [t for t in special if t not in CONTROL_FIRST],
        "model_max_length": 1000000,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")


def convert(llama_cpp: str, hf_dir: Path, out: str) -> None:
    """The converter's Gemma 4 vocabulary, other keys copied from the real vocabulary file."""
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    sys.path.insert(0, llama_cpp)
    import gguf
    from conversion.gemma import Gemma4Model

    real = gguf.GGUFReader(os.path.join(llama_cpp, "models/ggml-vocab-gemma-4.gguf"))
    writer = gguf.GGUFWriter(out, "gemma4")
    for key, field in real.fields.items():
        if key.startswith(("GGUF.", "tokenizer.", "general.architecture")):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, list(field.contents()), kind, field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), kind)
    Gemma4Model.set_vocab(types.SimpleNamespace(dir_model=hf_dir, gguf_writer=writer))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenizer_metadata(path: str, llama_cpp: str) -> list:
    """Every tokenizer.* key of the file: [key, GGUF type, item type or null, value]."""
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(path)
    keys = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        item = field.types[-1].name if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        keys.append([key, kind.name, item, value])
    return keys


# -- llama.cpp (llama venv) ----------------------------------------------------------------


def run_llama(path: str, texts: list) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab

    def piece(token: int, special: bool) -> bytes:
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for text in texts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        plain = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert ids[0] == llama_cpp.llama_vocab_bos(vocab) and plain == ids[1:], text
        cases.append({
            "text": text,
            "ids": ids,
            "decoded": b"".join(piece(t, False) for t in ids).decode("utf-8"),
            "decoded_special": b"".join(piece(t, True) for t in ids).decode("utf-8"),
        })
    return {
        "reference": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp 0c1e570), Llama(vocab_only=True)"
        ".tokenize(add_bos=True, special=True); text: llama_token_to_piece per id, special false/true",
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "end_of_generation": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "hidden": [i for i in range(n_vocab) if piece(i, False) != piece(i, True)],
        "cases": cases,
    }


def llama_reference(llama_python: str, path: str, texts: list, work: str) -> dict:
    texts_path = os.path.join(work, "texts.json")
    with open(texts_path, "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    out = subprocess.run(
        [llama_python, __file__, "--run-llama", path, texts_path],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def write_fixture(name: str, fixture: dict) -> None:
    """One case per line, so that a change reads as a diff of cases."""
    cases = fixture.pop("cases")
    head = json.dumps(fixture, ensure_ascii=False)[:-1]
    lines = ",\n".join(json.dumps(case, ensure_ascii=False) for case in cases)
    path = os.path.join(FIXTURES, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'{head}, "cases": [\n{lines}\n]}}\n')
    print(f"wrote {path} ({len(cases)} cases)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python 0.3.36")
    parser.add_argument("--llama-cpp", help="the sdist's vendor/llama.cpp")
    parser.add_argument("--run-llama", nargs=2, metavar=("GGUF", "TEXTS_JSON"))
    args = parser.parse_args()
    if args.run_llama:
        path, texts_path = args.run_llama
        with open(texts_path, encoding="utf-8") as f:
            texts = json.load(f)
        json.dump(run_llama(path, texts), sys.stdout, ensure_ascii=False)
        return

    texts = all_texts(args.llama_cpp)
    with tempfile.TemporaryDirectory() as work:
        hf_dir = Path(work) / "hf"
        write_hf_dir(hf_dir)
        synthetic = os.path.join(work, "gemma4-synthetic-vocab.gguf")
        convert(args.llama_cpp, hf_dir, synthetic)
        fixture = llama_reference(args.llama_python, synthetic, texts, work)
        fixture["vocabulary"] = (
            "synthetic: a BPE trained by tokenizers on the script's corpus, laid out as Gemma 4's, "
            "GGUF written by llama.cpp's Gemma4Model.set_vocab"
        )
        fixture["metadata"] = tokenizer_metadata(synthetic, args.llama_cpp)
        write_fixture("tokenizer_gemma4_synthetic.json", fixture)

        real = os.path.join(args.llama_cpp, "models/ggml-vocab-gemma-4.gguf")
        fixture = llama_reference(args.llama_python, real, texts, work)
        fixture["vocabulary"] = "llama.cpp 0c1e570 models/ggml-vocab-gemma-4.gguf (Gemma 4's tokenizer)"
        write_fixture("tokenizer_gemma4_vocab.json", fixture)


if __name__ == "__main__":
    main()
