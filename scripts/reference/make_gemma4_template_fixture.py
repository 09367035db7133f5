#!/usr/bin/env python3
"""Writes crates/text/tests/fixtures/chat_templates_gemma4.json: Gemma 4's chat template
(google/gemma-4-31B-it's, as llama.cpp ships it in models/templates/google-gemma-4-31B-it.jinja)
rendered by transformers' own `render_jinja_template` (Jinja2 as apply_chat_template runs it)
over conversations with a system prompt, tools, a tool call and its result, reasoning and
thinking on and off. The Rust test renders the same cases with minijinja and compares.

Run with the torch venv: `make_gemma4_template_fixture.py TEMPLATE.jinja`.
"""

import json
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template

OUT = os.path.join(
    os.path.dirname(__file__), "../../crates/text/tests/fixtures/chat_templates_gemma4.json"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hi there!"}],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "tool_round_trip": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris for 2 days?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "The user wants Paris weather.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Paris", "days": 2, "unit": "celsius"},
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ],
    "thinking_answer": [
        {"role": "user", "content": "Think, then answer: 7*6?"},
        {
            "role": "assistant",
            "content": "<|channel>thought\nSeven sixes.<channel|>42",
        },
        {"role": "user", "content": "Thanks."},
    ],
}


def main() -> None:
    with open(sys.argv[1]) as f:
        template = f.read()
    cases = []
    for name, messages in CONVERSATIONS.items():
        tools = [WEATHER] if name == "tool_round_trip" else None
        for kwargs in ({}, {"enable_thinking": True}):
            rendered = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=template,
                add_generation_prompt=True,
                bos_token="<bos>",
                eos_token="<eos>",
                **kwargs,
            )[0][0]
            cases.append(
                {
                    "conversation": name,
                    "messages": messages,
                    "tools": tools,
                    "chat_template_kwargs": kwargs,
                    "expected": rendered,
                }
            )
    fixture = {
        "source": "google/gemma-4-31B-it chat template, from llama.cpp 0c1e570 "
        "models/templates/google-gemma-4-31B-it.jinja",
        "renderer": "transformers render_jinja_template (Jinja2)",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "template": template,
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
