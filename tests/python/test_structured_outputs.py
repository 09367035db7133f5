"""Structured outputs through the official `openai` client: `chat.completions.parse` with a
Pydantic model, json_object, regex, choice, Lark and GBNF grammars, streaming, and the 400 for
a bad schema."""

from __future__ import annotations

import json
import re
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from conftest import MODEL_NAME

ASK = [{"role": "user", "content": "Describe a person called Ada who lives in London."}]


# Closed objects (`additionalProperties: false`), as OpenAI's strict mode requires and as the
# client's `parse` helper sends anyway: with open objects the small default model's greedy
# output may invent properties until max_tokens.
class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=20)


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)
    role: Literal["admin", "user", "guest"]
    tags: list[str] = Field(min_length=1, max_length=3)
    address: Address


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model=MODEL_NAME, messages=ASK, response_format=Person, max_tokens=200, temperature=0
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    person = choice.message.parsed
    assert isinstance(person, Person)
    # Validating again from the raw text: the constraint held, not just the client's parse.
    assert Person.model_validate_json(choice.message.content) == person


def test_json_object(client):
    response = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": 'Reply with a JSON object whose only key "answer" holds the number 4.'}],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    assert response.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(response.choices[0].message.content), dict)


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"guided_regex": r" [0-9]{3}-[0-9]{4}"}, lambda text: re.fullmatch(r" [0-9]{3}-[0-9]{4}", text)),
        ({"structured_outputs": {"regex": r" [0-9]{3}-[0-9]{4}"}}, lambda text: re.fullmatch(r" [0-9]{3}-[0-9]{4}", text)),
        ({"guided_choice": ["red", "green"]}, lambda text: text in ("red", "green")),
        (
            {"structured_outputs": {"grammar": 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]+/'}},
            lambda text: re.fullmatch(r"The answer is [0-9]+\.", text),
        ),
        (
            {"structured_outputs": {"grammar": 'root ::= "The answer is " number "."\nnumber ::= [0-9]+'}},
            lambda text: re.fullmatch(r"The answer is [0-9]+\.", text),
        ),
    ],
)
def test_regex_choice_and_grammars(client, extra, check):
    response = client.completions.create(
        model=MODEL_NAME, prompt="My phone number is", max_tokens=32, temperature=0, extra_body=extra
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert check(choice.text), choice.text


def test_streamed_json_schema(client):
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=ASK,
        max_tokens=200,
        temperature=0,
        stream=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": Person.model_json_schema(), "strict": True},
        },
    )
    content, finish = "", None
    for chunk in stream:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    Person.model_validate_json(content)


def test_bad_schema_is_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=ASK,
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        )
    assert error.value.body["param"] == "response_format.json_schema.schema"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(
            model=MODEL_NAME, prompt="x", max_tokens=8, extra_body={"guided_decoding_backend": "xgrammar"}
        )
    assert "llguidance" in error.value.body["message"]


# Schemas exercising what JSON-schema users lean on; every finished output must validate.
SCHEMAS = {
    "refs_and_defs": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                                            "y": {"type": "integer", "minimum": -5, "maximum": 5}},
                            "required": ["x", "y"], "additionalProperties": False}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
        "additionalProperties": False,
    },
    "any_of_and_enums": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"enum": ["none", "many"]}]},
            "kind": {"enum": ["a", "b", "c"]},
        },
        "required": ["value", "kind"],
        "additionalProperties": False,
    },
    "patterns_and_bounds": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "items": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2, "maxItems": 3},
        },
        "required": ["code", "score", "items"],
        "additionalProperties": False,
    },
    "nested_required": {
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                     "admin": {"type": "boolean"}},
                     "required": ["name", "admin"], "additionalProperties": False},
            "ids": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "maxItems": 4},
        },
        "required": ["user"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_validate_against_their_schemas(client, name, temperature):
    import jsonschema

    schema = SCHEMAS[name]
    response = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": f"Give an example of {name} as JSON."}],
        max_tokens=200,
        temperature=temperature,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_langchain_with_structured_output_json_schema(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL_NAME, base_url=server.api_url, api_key="unused", max_tokens=200, temperature=0)
    structured = llm.with_structured_output(Person, method="json_schema")
    result = structured.invoke("Describe a person called Ada who lives in London.")
    assert isinstance(result, Person)
