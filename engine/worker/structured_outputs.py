"""Structured outputs in the engine: grammars compiled once, one matcher per constrained sample,
and each step's token bitmask applied to the logits of the constrained rows, right before sampling.

    EngineCore.add_request ─> check(spec)        compile once per distinct spec (cached), or RequestRejected
    ModelRunner.execute    ─> mask(logits, rows)  constrained rows: matcher -> bitmask -> -inf on banned ids
                              Sampler.sample(...)
                           ─> advance(rows, tokens) each constrained row's matcher accepts its token
                              forget(finished ids)  matchers dropped with the request

The grammar engine is xgrammar. It needs the vocabulary, not a tokenizer: each token's
string in id order and the vocabulary's type (byte-level BPE, byte fallback, raw). The
engine reads both from the model folder's `tokenizer.json` (with the `tokenizers`
library) the first time a constrained request arrives: about a second, once per process,
plus xgrammar's import. A server that never sees a constrained request pays nothing,
not even at start-up, and nothing on the hot path touches a tokenizer.

A matcher's state follows the request's output tokens: each constrained row carries
`num_output_tokens`, and a matcher that has accepted more tokens than the request kept
is rolled back to it before its mask is computed (a sampled token the scheduler did not
keep). Preemption by recompute keeps the request's output tokens, so its matcher keeps
its state and the re-prefill neither advances nor resets it. The n samples of a request
(engine/scheduling/sample_group.py) are separate internal requests: each starts its own matcher
from the shared compiled grammar, i.e. a fork at the end of the prompt.

Each constrained row's mask is also narrowed to tokens that keep its bytes well-formed UTF-8
(engine/worker/utf8_guard.py: xgrammar takes a UTF-16 surrogate's bytes for a character).

A grammar whose text is complete allows only the model's EOS; a request that goes on
past it (ignore_eos) is not masked any more. Knows nothing about text or HTTP.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.outputs import ScheduledChunk
from engine.scheduling.request_checks import RequestRejected
from engine.worker import utf8_guard
from shared.structured import TOOL_CALL_END, TOOL_CALL_START, GrammarSpec

log = logging.getLogger("pageserve.engine")

MAX_CACHED_GRAMMARS = 256
"""Compiled grammars kept (least recently used dropped first); a JSON schema's is ~10-100 KB."""
MAX_ROLLBACK_TOKENS = 16


@dataclass
class _Guide:
    """One constrained sample's matcher and how many of its output tokens it has seen."""

    matcher: Any  # xgrammar.GrammarMatcher
    num_seen: int = 0
    broken: bool = False
    """A token the grammar refused was sampled anyway: the sample is no longer masked."""
    utf8_states: deque[int] = field(default_factory=lambda: deque([utf8_guard.START], maxlen=MAX_ROLLBACK_TOKENS + 1))
    """The UTF-8 decoder's state after each of the last seen tokens (the last: now), for rollbacks."""


class StructuredOutputs:
    def __init__(self, model_path: Path, vocab_size: int, eos_token_id: int | None) -> None:
        self._model_path = model_path
        self._vocab_size = vocab_size
        self._eos_token_id = eos_token_id
        self._compiler: Any = None  # xgrammar.GrammarCompiler, built at the first constrained request
        self._tokenizer_info: Any = None  # xgrammar.TokenizerInfo, with it
        self._compiled: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._guides: dict[str, _Guide] = {}
        self._buffer: torch.Tensor | None = None
        self._utf8: utf8_guard.Utf8Guard | None = None  # built with the first bitmask

    # -- admission ------------------------------------------------------------------------

    def check(self, spec: GrammarSpec) -> None:
        """Compile `spec` now (cached), so a request with a grammar xgrammar refuses is refused
        up front (a 4xx), never after it started."""
        self._compile(spec)

    def _compile(self, spec: GrammarSpec) -> Any:
        compiled = self._compiled.get(spec)
        if compiled is not None:
            self._compiled.move_to_end(spec)
            return compiled
        compiler = self._get_compiler()
        try:
            compiled = _compile_spec(compiler, spec)
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's verdict on the spec
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise RequestRejected(f"the {spec.kind} grammar cannot be compiled: {_strip_location(reason)}") from None
        self._compiled[spec] = compiled
        if len(self._compiled) > MAX_CACHED_GRAMMARS:
            self._compiled.popitem(last=False)
        return compiled

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar

            info = self._tokenizer_info = _tokenizer_info(self._model_path, self._vocab_size, self._eos_token_id)
            # xgrammar's own cache is off: `_compiled` is ours (bounded), and xgrammar's keys a grammar
            # by its printed text and compiles that text parsed back, which is not faithful (`_reparsable`).
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    # -- each step ------------------------------------------------------------------------

    def mask(self, logits: torch.Tensor, rows: list[ScheduledChunk]) -> None:
        """logits (N, V) float32, one row per chunk: banned tokens of constrained rows -> -inf."""
        constrained = [i for i, c in enumerate(rows) if c.grammar is not None]
        if not constrained:
            return  # unconstrained batches pay this one scan
        import xgrammar

        bitmask = self._bitmask(len(rows), logits.shape[1])  # (N, ceil(V / 32)) int32
        guard = self._utf8_guard(bitmask.shape[1])
        masked = []
        for i in constrained:
            guide = self._guide(rows[i])
            if guide.broken or guide.matcher.is_terminated():
                continue
            guide.matcher.fill_next_token_bitmask(bitmask, i)
            self._keep_utf8(bitmask, i, guide, guard, rows[i].request_id)
            masked.append(i)
        if masked:
            xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=masked)

    def _keep_utf8(self, bitmask: torch.Tensor, row: int, guide: _Guide, guard: utf8_guard.Utf8Guard,
                   request_id: str) -> None:
        """Narrow the row to tokens that keep the sample's bytes well-formed UTF-8 (engine/worker/utf8_guard.py),
        unless that leaves nothing: a grammar that asks for ill-formed bytes gets them."""
        narrowed = bitmask[row] & guard.allowed(guide.utf8_states[-1])
        if bool(narrowed.any()):
            bitmask[row] = narrowed
        else:
            log.warning("request %s: its grammar allows only ill-formed UTF-8 here", request_id)

    def _bitmask(self, num_rows: int, vocab_size: int) -> torch.Tensor:
        """A reused (num_rows, ceil(V / 32)) int32 buffer: each constrained row's fill writes its whole
        row, and only those rows are applied, so stale rows never matter. (xgrammar's
        allocate_token_bitmask took ~24 ms a call here, against ~0.5 ms for torch.full.)"""
        width = (vocab_size + 31) // 32
        if self._buffer is None or self._buffer.shape[0] < num_rows or self._buffer.shape[1] != width:
            self._buffer = torch.full((max(num_rows, 64), width), -1, dtype=torch.int32)
        return self._buffer[:num_rows]

    def _utf8_guard(self, width: int) -> utf8_guard.Utf8Guard:
        """The vocabulary's UTF-8 table for bitmasks `width` words wide: built at the first constrained step."""
        if self._utf8 is None or self._utf8.allowed(utf8_guard.START).shape[0] != width:
            self._get_compiler()
            self._utf8 = utf8_guard.Utf8Guard(self._tokenizer_info.decoded_vocab, width)
        return self._utf8

    def advance(self, rows: list[ScheduledChunk], tokens: list[int]) -> None:
        """Each constrained row's matcher accepts the token sampled for it."""
        for chunk, token in zip(rows, tokens, strict=True):
            guide = self._guides.get(chunk.request_id) if chunk.grammar is not None else None
            if guide is None:
                continue
            guide.num_seen += 1
            if self._utf8 is not None:
                guide.utf8_states.append(self._utf8.after(guide.utf8_states[-1], token))
            if guide.broken or guide.matcher.is_terminated():
                continue
            if not guide.matcher.accept_token(token):
                guide.broken = True
                log.warning("request %s: token %d is outside its grammar; no longer masked", chunk.request_id, token)

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._guides.pop(rid, None)

    @property
    def num_matchers(self) -> int:
        return len(self._guides)

    def _guide(self, chunk: ScheduledChunk) -> _Guide:
        guide = self._guides.get(chunk.request_id)
        if guide is None:
            import xgrammar

            assert chunk.grammar is not None
            matcher = xgrammar.GrammarMatcher(self._compile(chunk.grammar), max_rollback_tokens=MAX_ROLLBACK_TOKENS)
            guide = self._guides[chunk.request_id] = _Guide(matcher)
        extra = guide.num_seen - chunk.num_output_tokens
        assert extra >= 0, f"{chunk.request_id}: the matcher missed {-extra} of its output tokens"
        if extra:  # sampled tokens the scheduler did not keep
            if not guide.broken:
                guide.matcher.rollback(extra)
            for _ in range(extra):
                guide.utf8_states.pop()
            guide.num_seen = chunk.num_output_tokens
        return guide


def _compile_spec(compiler: Any, spec: GrammarSpec) -> Any:
    import xgrammar

    if spec.kind == "json_object":
        return compiler.compile_grammar(_json_grammar(xgrammar, '{"type": "object"}', strict=False))
    if spec.kind == "json_schema":
        return compiler.compile_grammar(_json_grammar(xgrammar, spec.value, strict=True))
    if spec.kind == "regex":
        return compiler.compile_regex(spec.value)
    if spec.kind == "grammar":
        return compiler.compile_grammar(spec.value)
    if spec.kind == "choice":
        choices = json.loads(spec.value)
        return compiler.compile_grammar("root ::= " + " | ".join(_ebnf_literal(c) for c in choices))
    if spec.kind == "tool_call":
        return compiler.compile_grammar(_tool_call_grammar(xgrammar, json.loads(spec.value)))
    raise ValueError(f"unknown grammar kind {spec.kind!r}")


def _tool_call_grammar(xgrammar: Any, tools: list[dict[str, Any]]) -> Any:
    """<tool_call>\\n{"name": <one of the tools>, "arguments": <its parameters>}\\n</tool_call>"""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, "arguments": t.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return xgrammar.Grammar.concat(
        xgrammar.Grammar.from_ebnf("root ::= " + _ebnf_literal(TOOL_CALL_START + "\n")),
        _json_grammar(xgrammar, json.dumps(schema), strict=True),
        xgrammar.Grammar.from_ebnf("root ::= " + _ebnf_literal("\n" + TOOL_CALL_END)),
    )


_LENGTH_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_STRING_CHAR = '[^\\0-\\x1f\\"\\\\\\r\\n]'


def _json_grammar(xgrammar: Any, schema: str, strict: bool) -> Any:
    """The grammar of JSON text valid against `schema`, compact (", " and ": " separators: no
    whitespace runs for a sampler to wander into).

    xgrammar 0.2.9 writes the characters of a string with minLength/maxLength as `[^"\\\r\n]`,
    which admits raw control characters (invalid JSON; found by tests/engine/worker/test_structured_outputs.py).
    We narrow that class to the one its unbounded strings use; such strings then hold no escapes."""
    ebnf = str(xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=strict))
    return xgrammar.Grammar.from_ebnf(_reparsable(ebnf).replace(_LENGTH_BOUNDED_CHAR, _JSON_STRING_CHAR))


_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|.)", re.DOTALL)


def _reparsable(ebnf: str) -> str:
    """xgrammar's printed EBNF, made to parse back to the same grammar.

    xgrammar 0.2.9 prints U+0080..U+00FF as `\\xHH`, but its parser reads every hex digit
    after `\\x`: "aéca" prints as `a\\xe9ca` and parses back as "a\\ue9ca" (one private-use
    character), so an enum literal with a Latin-1 letter came out mis-decoded (issue 17).
    `\\u00HH` reads exactly four digits. Other escapes (`\\\\` included) pass unchanged."""
    return _ESCAPE.sub(lambda m: f"\\u00{m.group(1)}" if m.group(1) else m.group(0), ebnf)


def _ebnf_literal(text: str) -> str:
    """An EBNF string literal: every character but plain ASCII letters and digits as \\uXXXX."""
    if not text:
        return '""'
    return '"' + "".join(c if c.isascii() and c.isalnum() else _escape(c) for c in text) + '"'


def _escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _strip_location(message: str) -> str:
    """xgrammar prefixes its messages with '[time] /path/file.cc:line: '; the client needs the rest."""
    head, sep, rest = message.partition(".cc:")
    if sep and ": " in rest:
        return rest.split(": ", 1)[1]
    return message


def _tokenizer_info(model_path: Path, vocab_size: int, eos_token_id: int | None) -> Any:
    """xgrammar's view of the vocabulary, from the model folder's tokenizer.json (no tokenizer object kept)."""
    import tokenizers
    import xgrammar

    file = model_path / "tokenizer.json"
    if not file.is_file():
        raise RequestRejected(f"structured outputs need the model's tokenizer.json, which {model_path} lacks")
    text = file.read_text()
    vocab = tokenizers.Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
    encoded = [""] * max(len(vocab), max(vocab.values()) + 1)
    for token, token_id in vocab.items():
        encoded[token_id] = token
    metadata = json.loads(text)
    vocab_type, prefix = _vocab_type(xgrammar, metadata)
    return xgrammar.TokenizerInfo(
        encoded, vocab_type=vocab_type, vocab_size=max(vocab_size, len(encoded)),
        stop_token_ids=[eos_token_id] if eos_token_id is not None else None, add_prefix_space=prefix,
    )


def _vocab_type(xgrammar: Any, tokenizer_json: dict[str, Any]) -> tuple[Any, bool]:
    """(xgrammar.VocabType, add_prefix_space) from a tokenizer.json's decoder, as xgrammar's own
    Hugging Face loader decides them."""
    decoder = json.dumps(tokenizer_json.get("decoder") or {})
    if '"ByteLevel"' in decoder:
        return xgrammar.VocabType.BYTE_LEVEL, False
    if '"ByteFallback"' in decoder:
        return xgrammar.VocabType.BYTE_FALLBACK, '"Metaspace"' in decoder or '"Strip"' in decoder
    return xgrammar.VocabType.RAW, False
