"""The official `openai` SDK's `client.responses.create(...)` against the real stack and model:
text, a JSON schema and a function tool, streamed and not; the events parse with the SDK's own
types. Plus lm-evaluation-harness's loglikelihood request shape on /v1/completions (echo, logprobs,
max_tokens 0)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                         "country": {"type": "string", "maxLength": 30}},
        "required": ["name", "country"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=stack.key, max_retries=0, timeout=300)


def test_text_whole_and_streamed(client: openai.OpenAI) -> None:
    r = client.responses.create(model="smollm2", input="What is the capital of France?",
                                instructions="Answer in one sentence.", max_output_tokens=24, temperature=0)
    assert r.output_text and r.usage is not None and 0 < r.usage.output_tokens <= 24
    events = list(client.responses.create(model="smollm2", input="What is the capital of France?",
                                          instructions="Answer in one sentence.", max_output_tokens=24,
                                          temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == r.output_text == events[-1].response.output_text  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_schema_and_a_function_tool(client: openai.OpenAI, stream: bool) -> None:
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    args = {"model": "smollm2", "input": "Describe Paris as JSON.", "text": fmt, "max_output_tokens": 80,
            "temperature": 0}
    tool = {"model": "smollm2", "input": "What is the weather in Paris?", "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 60, "temperature": 0}
    if stream:
        outputs = [list(client.responses.create(**a, stream=True))[-1].response  # type: ignore[union-attr]
                   for a in (args, tool)]
    else:
        outputs = [client.responses.create(**a) for a in (args, tool)]  # type: ignore[call-overload]
    jsonschema.validate(json.loads(outputs[0].output_text), CITY)
    (call,) = outputs[1].output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_previous_response_id_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="smollm2", input="hi", previous_response_id="resp_x")
    assert "previous_response_id" in str(e.value)


def test_loglikelihood_request_of_lm_evaluation_harness(client: openai.OpenAI) -> None:
    r = client.completions.create(model="smollm2", prompt="The capital of France is Paris", echo=True,
                                  logprobs=1, max_tokens=0, temperature=0)
    choice = r.choices[0]
    assert choice.text == "The capital of France is Paris" and r.usage is not None and r.usage.completion_tokens == 0
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert choice.logprobs.token_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in choice.logprobs.token_logprobs[1:])
