"""The tool-call parser: the same events whether the text comes whole or a character at a time."""

from __future__ import annotations

import json

import pytest

from gateway.tool_parser import ArgumentsDelta, Event, ToolCallParser, ToolCallStart


def _parse(text: str, step: int) -> tuple[str, list[tuple[str, str]], int]:
    """(content, [(name, arguments)], number of argument deltas) feeding `step` characters at a time."""
    parser = ToolCallParser()
    events: list[Event] = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i:i + step])
    events += parser.finish()
    content = "".join(e for e in events if isinstance(e, str))
    calls: list[list[str]] = []
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.id.startswith("call_") and e.index == len(calls)
            calls.append([e.name, ""])
        elif isinstance(e, ArgumentsDelta):
            calls[e.index][1] += e.text
    assert parser.num_calls == len(calls)
    return content, [(n, a) for n, a in calls], sum(isinstance(e, ArgumentsDelta) for e in events)


HERMES = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}is", "n": [1, {"d": 2}]}}'
          '\n</tool_call>\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_hermes_calls_stream_their_arguments(step: int) -> None:
    content, calls, num_deltas = _parse(HERMES, step)
    assert content == "Let me check.\n"
    assert calls == [("get_weather", '{"city": "Par}is", "n": [1, {"d": 2}]}'), ("noop", "{}")]
    assert json.loads(calls[0][1]) == {"city": "Par}is", "n": [1, {"d": 2}]}
    if step == 1:
        assert num_deltas > 10  # the arguments went out as they were written


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_smollm2_array_and_other_key_orders_are_parsed_at_the_closing_tag(step: int) -> None:
    text = '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"arguments": {}, "name": "b"}]</tool_call>'
    assert _parse(text, step)[:2] == ("", [("a", '{"x": 1}'), ("b", "{}")])


def test_text_without_calls_is_all_content_even_a_partial_tag() -> None:
    assert _parse("a < b and <tool", 1)[:2] == ("a < b and <tool", [])


def test_an_unparsable_call_is_returned_as_content() -> None:
    text = "<tool_call>\nnot json\n</tool_call>"
    assert _parse(text, 3)[:2] == ("<tool_call>\nnot json\n</tool_call>", [])


def test_a_call_cut_by_the_length_limit_keeps_what_was_streamed() -> None:
    content, calls, _ = _parse('<tool_call>\n{"name": "f", "arguments": {"q": "ab', 4)
    assert (content, calls) == ("", [("f", '{"q": "ab')])
