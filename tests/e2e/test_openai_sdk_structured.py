"""The official `openai` SDK, unchanged, against the real stack and the real default model:
JSON-schema outputs that parse and validate, forced tool calls whose arguments are valid JSON,
streamed and not, and the 400s it raises for a bad schema and a nameless tool."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
        "is_capital": {"type": "boolean"},
    },
    "required": ["name", "country", "population_millions", "is_capital"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe the city of Paris as JSON."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}}, "required": ["zone"]}}}
WEATHER_Q = [{"role": "user", "content": "What is the weather like in Paris today?"}]


class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: int
    is_capital: bool


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=stack.key, max_retries=0, timeout=300)


def _schema_format(schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": schema}}


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="smollm2", messages=ASK, response_format=_schema_format(CITY),
                                       max_tokens=120, temperature=0.7, seed=1)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), CITY)


def test_json_schema_output_validates_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="smollm2", messages=ASK, response_format=_schema_format(CITY),
                                            max_tokens=120, temperature=1.0, seed=2, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), CITY)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_non_ascii_enum_literals_arrive_whole(client: openai.OpenAI, stream: bool) -> None:
    """Issue 17: "aéca" once came out as "a\\ue9ca"; a CJK or emoji literal is split across byte-level
    tokens, and the gateway's detokenizer must hold partial UTF-8 back (streamed) rather than send U+FFFD."""
    words = ["aéca", "東京", "e😀f"]
    schema = {"type": "object", "properties": {w: {"enum": [w]} for w in words}, "required": words,
              "additionalProperties": False}
    args: dict[str, Any] = {"model": "smollm2", "messages": ASK, "response_format": _schema_format(schema),
                            "max_tokens": 60, "temperature": 0}
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args, stream=True)
                       if c.choices)
    else:
        text = client.chat.completions.create(**args).choices[0].message.content or ""
    assert json.loads(text) == {w: w for w in words}


def test_the_sdk_parses_a_pydantic_response_format(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model="smollm2", messages=ASK, response_format=City, max_tokens=120,
                                      temperature=0)
    assert isinstance(r.choices[0].message.parsed, City)


def test_a_forced_tool_call_has_valid_json_arguments(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=WEATHER_Q, tools=[WEATHER, TIME], max_tokens=100, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]


def test_a_required_tool_call_streams_argument_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="smollm2", messages=WEATHER_Q, tools=[WEATHER, TIME],
                                            tool_choice="required", max_tokens=100, temperature=1.0, seed=3,
                                            stream=True)
    names, args, ids, reasons = [], [], [], []
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for d in choice.delta.tool_calls or []:
                if d.id:
                    ids.append(d.id)
                    names.append(d.function.name if d.function else None)
                    args.append("")
                if d.function and d.function.arguments:
                    args[d.index] += d.function.arguments
    assert len(ids) == 1 and names[0] in ("get_weather", "get_time")
    assert isinstance(json.loads(args[0]), dict)
    assert [r for r in reasons if r][-1] == "tool_calls"


def test_the_conversation_continues_after_the_call(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="smollm2", messages=WEATHER_Q, tools=[WEATHER],
                                           tool_choice="required", max_tokens=100, temperature=0)
    call = (first.choices[0].message.tool_calls or [])[0]
    messages: list[Any] = [
        *WEATHER_Q,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    r = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], max_tokens=30,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage is not None and r.usage.prompt_tokens > 100  # the tools and the result were in the prompt


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": _schema_format({"type": "object", "properties": {"a": {"type": 7}}})},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
])
def test_bad_schema_and_nameless_tool_are_400_naming_the_param(client: openai.OpenAI, extra: dict[str, Any],
                                                               param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=5, **extra)
    assert e.value.status_code == 400 and e.value.param == param
