"""/v1/responses with the fake engine, read by the official SDK's own types (its client over the app).

The fake engine says " Paris is lovely." (tests/gateway/conftest.py) unless a test scripts a tool call.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.gateway.fakes import Script

SAID = " Paris is lovely."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def sdk(gw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=gw.key, http_client=gw.client, max_retries=0)


def test_text_whole_and_streamed_parse_with_the_sdks_types(make_gateway: Any, tokenizer: Any) -> None:
    gw = make_gateway()
    client = sdk(gw)
    r = client.responses.create(model="smollm2", input="Capital of France?", instructions="Be brief.",
                                max_output_tokens=8, temperature=0)
    assert r.output_text == SAID and r.object == "response"
    # The fake engine ends on its length: the response is incomplete for max_output_tokens, as OpenAI says.
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 4 and r.usage.input_tokens > 0
    prompt = tokenizer.decode(gw.engine.submitted[0].prompt_token_ids, skip_special_tokens=False)
    assert "Be brief." in prompt and "Capital of France?" in prompt
    assert gw.engine.submitted[0].sampling.max_tokens == 8
    events = list(client.responses.create(model="smollm2", input=[{"role": "user", "content": "Hi"}], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == SAID
    assert events[-1].response.output_text == SAID  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_tool_call(make_gateway: Any, tokenizer: Any, stream: bool) -> None:
    ids = tokenizer.encode(CALL, add_special_tokens=False)
    gw = make_gateway(lambda r: Script(samples=[ids], reason="stop"))
    client = sdk(gw)
    args = {"model": "smollm2", "input": "Weather in Paris?", "tools": [TOOL]}
    if stream:
        events = list(client.responses.create(**args, stream=True))
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
        response = events[-1].response  # type: ignore[union-attr]
    else:
        response = client.responses.create(**args)
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id


def test_text_format_json_schema_and_tools_reach_the_engine(make_gateway: Any) -> None:
    gw = make_gateway()
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    sdk(gw).responses.create(model="smollm2", input="Paris as JSON",
                             text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}})
    assert gw.engine.submitted[0].grammar is not None and gw.engine.submitted[0].grammar.kind == "json_schema"
    sdk(gw).responses.create(model="smollm2", input="Weather?", tools=[TOOL],  # type: ignore[list-item]
                             tool_choice={"type": "function", "name": "get_weather"})
    assert gw.engine.submitted[1].grammar is not None


def test_a_conversation_after_a_call_and_the_400s(make_gateway: Any) -> None:
    gw = make_gateway()
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    r = gw.post("/v1/responses", {"model": "smollm2", "input": items, "tools": [TOOL]})
    assert r.status_code == 200, r.text
    for body, param in (({"previous_response_id": "resp_1"}, "previous_response_id"),
                        ({"max_output_tokens": 0}, "max_output_tokens"),
                        ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
                        ({"tools": [{"type": "web_search"}]}, "tools[0].type")):
        bad = gw.post("/v1/responses", {"model": "smollm2", "input": "hi", **body})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
