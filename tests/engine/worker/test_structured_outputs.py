"""Structured outputs in the engine, on the tiny random Llama with a tiny byte-level vocabulary: whatever
the random weights prefer, every constrained output parses and obeys its grammar."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tokenizers
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine.llm import LLM
from engine.outputs import ScheduledChunk
from engine.request import Request
from engine.scheduling.request_checks import RequestRejected
from engine.worker.structured_outputs import StructuredOutputs
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec
from tests.engine.model_fixtures import make_llm, random_prompts
from tests.support.tiny_model import tiny_folder, tiny_llama_folder
from tests.support.tiny_tokenizer import tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_with_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tiny_llama_folder(tmp_path_factory.mktemp("tiny-vocab"))
    tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def llm(tiny_with_vocab: Path) -> LLM:
    return make_llm(tiny_with_vocab, blocks=256, budget=64, seqs=8)


@pytest.fixture(scope="module")
def decode(tiny_with_vocab: Path) -> Any:
    tok = tokenizers.Tokenizer.from_file(str(tiny_with_vocab / "tokenizer.json"))
    return lambda ids: tok.decode([t for t in ids if t != 2], skip_special_tokens=False)


def _nothing_held(llm: LLM) -> None:
    llm.core.step()  # hands the last finished ids to the runner
    assert llm.core.structured.num_matchers == 0
    assert not llm.core.has_unfinished()


# -- random JSON schemas ---------------------------------------------------------------------

_names = st.sampled_from(["a", "bb", "name", "x_1", "value", "q"])
_leaves = st.one_of(
    st.builds(lambda lo, n: {"type": "string", "minLength": lo, "maxLength": lo + n},
              st.integers(0, 2), st.integers(0, 6)),
    st.builds(lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
              st.integers(-50, 50), st.integers(0, 500)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda xs: {"enum": xs}, st.lists(st.one_of(st.text("abc\"é中😀", max_size=4), st.integers(-9, 99)),
                                                min_size=1, max_size=4, unique=True)),
)


def _containers(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    arrays = st.builds(lambda item, lo, n: {"type": "array", "items": item, "minItems": lo, "maxItems": lo + n},
                       children, st.integers(0, 1), st.integers(0, 2))
    objects = st.dictionaries(_names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.builds(
            lambda required: {"type": "object", "properties": props, "required": sorted(required),
                              "additionalProperties": False},
            st.sets(st.sampled_from(sorted(props)))))
    return arrays | objects


_schemas = st.recursive(_leaves, _containers, max_leaves=6).map(
    lambda s: s if s.get("type") == "object" else {"type": "object", "properties": {"v": s}, "required": ["v"]})


# No shrinking: each example runs the model, and a failing example is printed whole anyway.
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schemas=st.lists(_schemas, min_size=1, max_size=3), seed=st.integers(0, 2**31), greedy=st.booleans())
def test_json_schema_outputs_always_parse_and_validate(llm: LLM, decode: Any, schemas: list[dict[str, Any]],
                                                       seed: int, greedy: bool) -> None:
    prompts = random_prompts([7, 19, 3, 11][: len(schemas) + 1], 512, seed=seed % 1000)
    params = [SamplingParams(temperature=0.0 if greedy else 1.0, seed=seed + i, max_tokens=400)
              for i in range(len(schemas))] + [SamplingParams(temperature=1.0, max_tokens=8)]
    grammars = [GrammarSpec("json_schema", json.dumps(s)) for s in schemas] + [None]  # one free row beside
    results = llm.generate(prompts, params, detokenize=False, grammar=grammars)
    for schema, result in zip(schemas, results, strict=False):
        assert result.finish_reason == "stop"
        jsonschema.validate(json.loads(decode(result.token_ids)), schema)
    _nothing_held(llm)


@pytest.mark.parametrize("literal", ["aéca", "ÿf", "x中文y", "e😀f"])
def test_non_ascii_literals_come_out_whole(llm: LLM, decode: Any, literal: str) -> None:
    """Issue 17: xgrammar prints U+0080..U+00FF as `\\xHH` and parses every hex digit after `\\x` back,
    so "aéca" once came out as "a\\ue9ca" (a JSON schema's enum, a tool's schema)."""
    enum = {"type": "object", "properties": {"v": {"enum": [literal]}}, "required": ["v"]}
    specs = [GrammarSpec("json_schema", json.dumps(enum)),
             GrammarSpec("tool_call", json.dumps([{"name": "f", "parameters": enum}]))]
    params = SamplingParams(temperature=0.0, max_tokens=80)
    texts = [decode(r.token_ids) for r in llm.generate(random_prompts([6, 6], 512, seed=2), params,
                                                         detokenize=False, grammar=specs)]
    assert json.loads(texts[0]) == {"v": literal}
    assert json.loads(texts[1][12:-13]) == {"name": "f", "arguments": {"v": literal}}
    _nothing_held(llm)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_gives_way_to_a_finished_grammar(llm: LLM, decode: Any, temperature: float,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Issue 17: the grammar wins. Once it allows only EOS the request ends there ("stop"), short of
    min_tokens, its output valid; a free row beside it still honours min_tokens."""
    schema = {"type": "object", "properties": {"v": {"enum": ["ab", "cd"]}}, "required": ["v"]}
    params = [SamplingParams(temperature=temperature, seed=3, min_tokens=40, max_tokens=60),
              SamplingParams(temperature=temperature, seed=4, min_tokens=12, max_tokens=12)]
    constrained, free = llm.generate(random_prompts([6, 8], 512, seed=4), params, detokenize=False,
                                     grammar=[GrammarSpec("json_schema", json.dumps(schema)), None])
    assert constrained.finish_reason == "stop" and len(constrained.token_ids) < 40
    jsonschema.validate(json.loads(decode(constrained.token_ids)), schema)
    assert "outside its grammar" not in caplog.text
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    _nothing_held(llm)


def test_regex_choice_json_object_and_ebnf(llm: LLM, decode: Any) -> None:
    prompts = random_prompts([5, 9, 13, 4, 8], 512, seed=3)
    specs = [
        GrammarSpec("regex", r"[a-z]{2,5}@[a-z]{1,4}\.(com|org)"),
        GrammarSpec("choice", json.dumps(['say "yes"', "no", "é\\n"])),
        GrammarSpec("json_object"),
        GrammarSpec("grammar", 'root ::= "(" [0-9] ("+" [0-9])* ")"'),
        GrammarSpec("tool_call", json.dumps([{"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}},
            {"name": "noop", "parameters": None}])),
    ]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200) for s in range(len(specs))]
    texts = [decode(r.token_ids) for r in llm.generate(prompts, params, detokenize=False, grammar=specs)]
    assert re.fullmatch(r"[a-z]{2,5}@[a-z]{1,4}\.(com|org)", texts[0])
    assert texts[1] in ['say "yes"', "no", "é\\n"]
    assert isinstance(json.loads(texts[2]), dict) or texts[2]  # json_object may run to the length limit
    assert re.fullmatch(r"\([0-9](\+[0-9])*\)", texts[3])
    head, body, tail = texts[4][:12], texts[4][12:-13], texts[4][-13:]
    assert (head, tail) == ("<tool_call>\n", "\n</tool_call>")
    call = json.loads(body)
    assert call["name"] in ("get_weather", "noop") and isinstance(call["arguments"], dict)
    _nothing_held(llm)


def test_n_samples_each_follow_the_grammar(llm: LLM, decode: Any) -> None:
    schema = {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 10**6}},
              "required": ["k"], "additionalProperties": False}
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=60)
    result = llm.generate(random_prompts([10], 512, seed=9), params, detokenize=False,
                          grammar=GrammarSpec("json_schema", json.dumps(schema)))[0]
    values = [json.loads(decode(o.token_ids)) for o in result.outputs]
    for v in values:
        jsonschema.validate(v, schema)
    assert len({v["k"] for v in values}) > 1  # four matchers, four different draws
    _nothing_held(llm)


def test_preemption_by_recompute_keeps_the_grammar_state(tiny_with_vocab: Path, decode: Any) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 12},
                                               "n": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}},
              "required": ["s", "n"], "additionalProperties": False}
    spec = GrammarSpec("json_schema", json.dumps(schema))
    prompts = random_prompts([30, 28, 26, 24], 512, seed=5)
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=80)
    roomy = make_llm(tiny_with_vocab, blocks=256).generate(prompts, params, detokenize=False, grammar=spec)
    tight = make_llm(tiny_with_vocab, blocks=32, preemption_mode="recompute")
    squeezed = tight.generate(prompts, params, detokenize=False, grammar=spec)
    assert tight.core.stats().preemptions > 0
    assert [r.token_ids for r in squeezed] == [r.token_ids for r in roomy]
    for r in squeezed:
        jsonschema.validate(json.loads(decode(r.token_ids)), schema)
    _nothing_held(tight)


def test_a_matcher_ahead_of_its_request_is_rolled_back(tiny_with_vocab: Path) -> None:
    import torch

    structured = StructuredOutputs(tiny_with_vocab, 512, 2)
    spec = GrammarSpec("choice", json.dumps(["ab", "cd"]))
    tok = tokenizers.Tokenizer.from_file(str(tiny_with_vocab / "tokenizer.json"))
    a, c = tok.token_to_id("a"), tok.token_to_id("c")

    def chunk(num_output: int) -> ScheduledChunk:
        return ScheduledChunk("r", [5], 3, [0], True, SamplingParams(), num_output, 2, grammar=spec)

    def allowed(num_output: int) -> set[int]:
        logits = torch.zeros(1, 512)
        structured.mask(logits, [chunk(num_output)])
        return set(torch.nonzero(logits[0] == 0).flatten().tolist())

    first = allowed(0)
    assert a in first and c in first
    structured.advance([chunk(0)], [a])
    assert c not in allowed(1)
    assert allowed(0) == first  # the token after "a" was not kept: back to the start
    structured.forget(["r"])
    assert structured.num_matchers == 0


def test_a_grammar_xgrammar_refuses_is_a_rejected_request(llm: LLM) -> None:
    bad = Request("bad", [5, 6, 7], SamplingParams(max_tokens=4), 0.0,
                  grammar=GrammarSpec("json_schema", '{"type": "frobnicate"}'))
    with pytest.raises(RequestRejected, match="json_schema grammar cannot be compiled.*frobnicate"):
        llm.core.add_request(bad)
    with pytest.raises(RequestRejected, match="regex"):
        llm.core.add_request(Request("bad2", [5], SamplingParams(), 0.0, grammar=GrammarSpec("regex", "a(")))
    assert not llm.core.has_unfinished()


def test_unconstrained_engines_never_load_the_grammar_engine(tiny_model_no_vocab: Path) -> None:
    llm = make_llm(tiny_model_no_vocab)
    llm.generate(random_prompts([6, 9], 512), SamplingParams(temperature=1.0, max_tokens=5), detokenize=False)
    assert llm.core.structured._compiler is None
    with pytest.raises(RequestRejected, match="tokenizer.json"):
        llm.core.add_request(Request("g", [5], SamplingParams(), 0.0, grammar=GrammarSpec("json_object")))


@pytest.fixture(scope="module")
def tiny_model_no_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny-plain"))


def test_length_bounded_strings_admit_no_raw_control_characters(tiny_with_vocab: Path) -> None:
    """xgrammar 0.2.9 lets a string with maxLength hold raw control characters (invalid JSON); we narrow it."""
    import xgrammar

    structured = StructuredOutputs(tiny_with_vocab, 512, 2)
    schema = {"type": "object", "properties": {"v": {"type": "string", "maxLength": 5}}, "required": ["v"]}
    matcher = xgrammar.GrammarMatcher(structured._compile(GrammarSpec("json_schema", json.dumps(schema))))
    assert matcher.accept_string('{"v": "ab')
    assert not matcher.accept_string("\x12")
    assert matcher.accept_string('c"}') and matcher.is_completed()


@pytest.mark.parametrize("architecture", ["gemma2", "qwen3_moe", "phi3"])
def test_other_architectures_follow_a_schema_with_logprobs(architecture: str, tmp_path: Path) -> None:
    """Structured outputs and logprobs do not depend on the architecture: a JSON schema is followed and
    each token's logprob is reported, on models with windows and soft-caps, experts, partial rotary."""
    folder = tiny_folder(architecture, tmp_path)
    tiny_tokenizer(folder)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    llm = make_llm(folder, blocks=256, budget=64, seqs=8)
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}, "n": {"type": "integer"}},
              "required": ["city", "n"], "additionalProperties": False}
    params = SamplingParams(temperature=0.0, max_tokens=60, logprobs=2)
    result = llm.generate(random_prompts([9], 512), params, detokenize=False,
                          grammar=GrammarSpec("json_schema", json.dumps(schema)))[0]
    assert result.finish_reason == "stop"
    jsonschema.validate(json.loads(tok.decode([t for t in result.token_ids if t != 2])), schema)
    lps = result.outputs[0].logprobs
    assert len(lps) == len(result.token_ids) and all(lp.logprob <= 0.0 and len(lp.top_token_ids) == 2 for lp in lps)
