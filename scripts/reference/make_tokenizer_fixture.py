#!/usr/bin/env python3
"""Writes the tokenizer and chat-template fixtures for crates/text from reference implementations.

Token ids come from llama.cpp (llama-cpp-python 0.3.16, pinned) loading the default model's GGUF
with vocab_only=True, tokenizing with add_bos=False and special=True (parse_special) exactly as
llama.cpp's server does for a raw prompt. Chat-template expectations come from Jinja2 configured
the way Hugging Face transformers' `apply_chat_template` configures it (trim_blocks,
lstrip_blocks, loopcontrols, raise_exception, strftime_now, tojson with ensure_ascii=False), plus
transformers' `continue_final_message` post-processing.

A second fixture pins the SentencePiece ("llama" tokenizer model) path, for which no small GGUF
is at hand: the script trains a small SentencePiece-style BPE vocabulary (scores = merge order,
256 <0xXX> byte-fallback tokens) on a fixed corpus, writes it to a vocabulary-only GGUF in a temp
directory, and records llama.cpp's ids (add_bos=True, special=True) next to the vocabulary.

Run by a developer (not CI), e.g.:
    /work/cache/refvenv/bin/python scripts/reference/make_tokenizer_fixture.py \
        --model ~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import collections
import json
import os
import tempfile
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox
import llama_cpp

PROMPTS = [
    "The capital of France is",
    "Hello, world! How are you doing today?",
    "Café naïve façade résumé — Zürich über Straße",
    "I love 🦀 Rust and 🐍 Python! 👍🏽 👨‍👩‍👧‍👦",
    "你好，世界！日本語のテキストです。한국어 문장입니다.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "  leading spaces\n\n\n\ttabs\t\tand   multiple    spaces   \n  trailing  ",
    "In 2024, 3.14159 * 1000000 = 3141590.0 and 1,234,567",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure they'll say it's what we've done, isn't it? She'd've",
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}',
    "Привет мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם हिन्दी",
    "",
    " ",
    "\n",
    '{"name": "tokenmill", "tags": ["fast", "safe"], "n": 42}',
    "## Title\n\n- item **bold** [link](https://example.com/path?q=1&r=2)\n",
    "∀x ∈ ℝ: x² ≥ 0 → √(x²) = |x| ±∞ ≈ ≠ ≤",
    "abc<|endoftext|>def <file_sep> x<|im_end|>",
    "aaaaaaaaaaaaaaaaaaaa!!!!!!!!??????..........",
    "e\u0301 a\u0308 \u00e9 zero\u200bwidth \ufeffbom",
    "Tabs\tand\r\nwindows\r\nnewlines   \r\n",
    "🎉🎉🎉 emoji only 😀😃😄😁",
    "<|im_start|><|im_start|>nested <|im_end|",
    "IT'S DON'T they’re ½ ² ٣٤ 10⁶ Ⅻ",
    "\n \n  \t \u3000x  \u00a0y\t\n",
    "    indented = {'key': [1, 2, 3]}  # comment\n\treturn x**2 // 3",
    "<|im_end|>",
]

# A template that exercises what Hugging Face templates use beyond the default model's simple one:
# pycompat string methods, dict items, namespace, loop variables, tojson with indent,
# raise_exception, tools, documents and extra kwargs.
FEATURE_TEMPLATE = """{%- set ns = namespace(system='') -%}
{%- if messages[0]['role'] == 'system' -%}
{%- set ns.system = messages[0]['content'].strip() -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{{ bos_token }}
{%- if tools %}
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools>
{%- endif %}
{%- if documents %}
{% for doc in documents %}
[doc {{ loop.index }}/{{ loop.length }}] {% for key, value in doc.items() %}{{ key }}={{ value }}{% if not loop.last %}; {% endif %}{% endfor %}

{% endfor %}
{%- endif %}
{%- if ns.system %}
<<SYS>>{{ ns.system }}<</SYS>>
{% endif %}
{%- for message in loop_messages %}
{%- if message['role'] not in ['user', 'assistant', 'tool'] %}
{{- raise_exception('Unsupported role: ' + message['role']) }}
{%- endif %}
{%- if message['role'] == 'user' and message['content'].startswith('/') %}
[command {{ message['content'].split(' ')[0][1:] }}]
{%- endif %}
{%- if message['role'] == 'tool' %}
<tool_response name="{{ message.name }}">{{ message['content'] }}</tool_response>
{%- elif message.tool_calls is defined and message.tool_calls %}
{%- for call in message.tool_calls %}
<tool_call>{{ call.function | tojson(indent=2) }}</tool_call>
{%- endfor %}
{%- else %}
<|{{ message['role'] }}|>{{ message['content'] | trim }}{% if loop.last and message['role'] == 'assistant' %}{{ eos_token }}{% endif %}

{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}
{%- endif %}"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city — °C, with \"quotes\" & <tags>",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is 2 + 2?"}],
    "system_user": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "Name a color."},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi! ¿Qué tal? 你好 🦀"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "/search rust tokenizers please"},
    ],
    "tool_roundtrip": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
                }
            ],
        },
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    ],
    "prefill_assistant": [
        {"role": "user", "content": "Write a haiku about the sea."},
        {"role": "assistant", "content": "Waves fold into foam,"},
    ],
}


def hf_environment():
    """Jinja2 set up as transformers' chat_template_utils._compile_jinja_template does."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def continue_final_message(rendered, messages):
    """transformers' apply_chat_template(continue_final_message=True) post-processing."""
    final_message = messages[-1]["content"]
    if final_message.strip() not in rendered:
        raise ValueError("final message not in rendered chat")
    loc = rendered.rindex(final_message.strip())
    if rendered[loc : loc + len(final_message.lstrip())] == final_message:
        return rendered[: loc + len(final_message.lstrip())]
    return rendered[: loc + len(final_message.strip())]


def render_cases(env, templates, bos_token, eos_token):
    cases = []
    for template_name, source in templates.items():
        template = env.from_string(source)
        for conversation_name, messages in CONVERSATIONS.items():
            variants = [
                {"add_generation_prompt": False, "continue_final_message": False},
                {"add_generation_prompt": True, "continue_final_message": False},
            ]
            if messages[-1]["role"] == "assistant":
                variants.append({"add_generation_prompt": False, "continue_final_message": True})
            for variant in variants:
                extra = {}
                if template_name == "feature":
                    extra = {
                        "tools": [WEATHER_TOOL] if "tool" in conversation_name else None,
                        "documents": [{"title": "Doc A", "text": "alpha"}, {"title": "Doc B", "text": "beta"}]
                        if conversation_name == "multi_turn"
                        else None,
                    }
                    if variant["add_generation_prompt"] and conversation_name == "user_only":
                        extra["chat_template_kwargs"] = {"enable_thinking": False}
                kwargs = dict(extra.get("chat_template_kwargs") or {})
                rendered = template.render(
                    messages=messages,
                    add_generation_prompt=variant["add_generation_prompt"],
                    bos_token=bos_token,
                    eos_token=eos_token,
                    tools=extra.get("tools"),
                    documents=extra.get("documents"),
                    **kwargs,
                )
                if variant["continue_final_message"]:
                    rendered = continue_final_message(rendered, messages)
                cases.append(
                    {
                        "template": template_name,
                        "conversation": conversation_name,
                        "messages": messages,
                        "add_generation_prompt": variant["add_generation_prompt"],
                        "continue_final_message": variant["continue_final_message"],
                        "tools": extra.get("tools"),
                        "documents": extra.get("documents"),
                        "chat_template_kwargs": extra.get("chat_template_kwargs"),
                        "expected": rendered,
                    }
                )
    return cases


SPM_CORPUS = """
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun while the fox runs.
Tokenizers split text into pieces; the pieces are tokens and the tokens have ids.
def main(): print("hello world") return 0  # the main function prints hello world
Once upon a time there was a little model that wanted to serve many requests at the same time.
It learned to batch, to page its cache, and to stream tokens back to every user as they came.
Café, naïve, résumé and façade are words with accents; so is the German word Straße.
"""

SPM_PROMPTS = [
    "The quick brown fox",
    "Hello world",
    " leading space and  double  spaces",
    "trailing spaces   ",
    "line one\nline two\n\nline four",
    "Café naïve Straße résumé",
    "emoji 🦀 and CJK 你好 fall back to bytes",
    "tokens</s>after the end<s>start",
    "def main(): return 42",
    "",
    "the the the thethethe",
    "Once upon a time, the model served requests.",
]


def train_spm_vocab(corpus, merges_wanted=400):
    """A SentencePiece-style BPE vocabulary: words are '▁'-prefixed, merges learned greedily by
    pair frequency, score = -merge index (single characters score below every merge)."""
    words = collections.Counter("\u2581" + w for w in corpus.split())
    segmented = {w: list(w) for w in words}
    pieces = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for w, count in words.items():
            symbols = segmented[w]
            for a, b in zip(symbols, symbols[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda item: (item[1], item[0]))
        merged = a + b
        if merged not in pieces:
            pieces.append(merged)
        for w in words:
            symbols = segmented[w]
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            segmented[w] = out
    chars = sorted({c for w in words for c in w})
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(float(-i))
    for i, c in enumerate(chars):
        if c not in tokens:
            tokens.append(c)
            types.append(1)
            scores.append(float(-len(pieces) - i))
    return tokens, scores, types


def make_spm_fixture(out_dir):
    import gguf

    tokens, scores, types = train_spm_vocab(SPM_CORPUS)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "spm-vocab.gguf")
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_context_length(512)
        writer.add_embedding_length(64)
        writer.add_block_count(1)
        writer.add_feed_forward_length(128)
        writer.add_head_count(4)
        writer.add_head_count_kv(4)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        cases = [
            {"prompt": p, "ids": llm.tokenize(p.encode("utf-8"), add_bos=True, special=True)} for p in SPM_PROMPTS
        ]
        del llm
    fixture = {
        "source": f"llama-cpp-python {llama_cpp.__version__}, vocabulary-only GGUF, tokenize(add_bos=True, special=True)",
        "vocab": {"tokens": tokens, "scores": scores, "token_types": types},
        "cases": cases,
    }
    with open(os.path.join(out_dir, "tokenizer_spm_synthetic.json"), "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} SentencePiece cases ({len(tokens)} tokens)")


def main():
    parser = argparse.ArgumentParser()
    default_model = os.environ.get(
        "TOKENMILL_TEST_MODEL",
        os.path.expanduser("~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    parser.add_argument("--model", default=default_model)
    parser.add_argument("--out-dir", default="crates/text/tests/fixtures")
    args = parser.parse_args()

    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    entries = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        decoded = llm.detokenize(ids, special=True).decode("utf-8")
        entries.append({"prompt": prompt, "ids": ids, "llama_cpp_detokenized": decoded})
    tokenizer_fixture = {
        "source": f"llama-cpp-python {llama_cpp.__version__}, Llama(vocab_only=True).tokenize(add_bos=False, special=True)",
        "model": os.path.basename(args.model),
        "cases": entries,
    }
    with open(os.path.join(args.out_dir, "tokenizer_smollm2.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")

    smollm_template = llm.metadata["tokenizer.chat_template"]
    bos_token = llm.detokenize([llm.token_bos()], special=True).decode("utf-8")
    eos_token = llm.detokenize([llm.token_eos()], special=True).decode("utf-8")
    env = hf_environment()
    templates = {"smollm2": smollm_template, "feature": FEATURE_TEMPLATE}
    chat_fixture = {
        "source": f"jinja2 {jinja2.__version__} configured as transformers apply_chat_template",
        "templates": templates,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "cases": render_cases(env, templates, bos_token, eos_token),
    }
    with open(os.path.join(args.out_dir, "chat_templates_smollm2.json"), "w", encoding="utf-8") as f:
        json.dump(chat_fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(entries)} tokenizer cases and {len(chat_fixture['cases'])} chat cases to {args.out_dir}")
    make_spm_fixture(args.out_dir)


if __name__ == "__main__":
    main()
