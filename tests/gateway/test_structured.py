"""Structured outputs and tools at the gateway (fake engine): what reaches the engine, the 400s,
and tool calls in OpenAI's response and stream shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.structured import GrammarSpec
from tests.gateway.fakes import Script

USER = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL_TEXT = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _chat(gw: Any, **fields: Any) -> Any:
    return gw.post("/v1/chat/completions", {"model": "smollm2", "messages": USER, "max_tokens": 40, **fields})


@pytest.mark.parametrize(("fields", "expected"), [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, GrammarSpec("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}},
     GrammarSpec("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}}}')),
    ({"guided_regex": "[a-z]+"}, GrammarSpec("regex", "[a-z]+")),
    ({"guided_choice": ["yes", "no"]}, GrammarSpec("choice", '["yes", "no"]')),
    ({"guided_json": '{"type": "array"}'}, GrammarSpec("json_schema", '{"type":"array"}')),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, GrammarSpec("grammar", 'root ::= "a"')),
    ({"tools": TOOLS, "tool_choice": "auto"}, None),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     GrammarSpec("tool_call", json.dumps([{"name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]))),
])
def test_the_grammar_reaches_the_engine(make_gateway: Any, fields: dict[str, Any], expected: Any) -> None:
    gw = make_gateway()
    assert _chat(gw, **fields).status_code == 200
    assert gw.engine.submitted[-1].grammar == expected


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"minLength": -1}}}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "a("}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_structured_fields_are_400_naming_the_param(make_gateway: Any, fields: dict[str, Any],
                                                        param: str) -> None:
    gw = make_gateway()
    r = _chat(gw, **fields)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not gw.engine.submitted


def _says(text: str, tokenizer: Any, reason: str = "stop") -> Any:
    return lambda request: Script([tokenizer.encode(text, add_special_tokens=False)] * request.sampling.n, reason)


def test_a_tool_call_in_the_whole_response(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway(_says(CALL_TEXT, tokenizer))
    body = _chat(gw, tools=TOOLS, tool_choice="required").json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Sure."
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert gw.engine.submitted[-1].grammar is not None and gw.engine.submitted[-1].grammar.kind == "tool_call"


def test_a_tool_call_streams_as_argument_deltas(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway(_says(CALL_TEXT, tokenizer))
    lines = _chat(gw, tools=TOOLS, stream=True).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all("id" not in c and c["index"] == 0 for c in calls[1:]) and len(calls) > 2
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [line for line in lines if line][-1] == "data: [DONE]"


def test_tool_choice_none_leaves_the_text_alone(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway(_says(CALL_TEXT, tokenizer))
    choice = _chat(gw, tools=TOOLS, tool_choice="none").json()["choices"][0]
    assert choice["message"]["content"] == CALL_TEXT and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"


def test_a_conversation_continues_after_a_call(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
    ]
    r = gw.post("/v1/chat/completions", {"model": "smollm2", "messages": messages, "tools": TOOLS, "max_tokens": 8})
    assert r.status_code == 200, r.text
    prompt = tokenizer.decode(gw.engine.submitted[-1].prompt_token_ids, skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt  # the tool list, in the system message
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>\n21 C, sunny\n</tool_response>" in prompt
    bad = gw.post("/v1/chat/completions", {"model": "smollm2", "max_tokens": 8,
                                            "messages": [*USER, {"role": "tool", "content": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages[1].tool_call_id"
