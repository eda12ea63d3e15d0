"""The UTF-8 guard of constrained samples (engine/worker/utf8_guard.py): its table against Python's own
decoder, and, through StructuredOutputs, a sampler that prefers a surrogate's bytes still gets text
that decodes to what the grammar counted."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import jsonschema
import pytest
import torch

from engine.outputs import ScheduledChunk
from engine.worker.structured_outputs import StructuredOutputs
from engine.worker.utf8_guard import START, Utf8Guard
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec
from tests.support.tiny_model import tiny_llama_folder
from tests.support.tiny_tokenizer import tiny_tokenizer


def _allowed(guard: Utf8Guard, state: int, token: int) -> bool:
    return bool((int(guard.allowed(state)[token // 32]) >> (token % 32)) & 1)


def _walk(guard: Utf8Guard, tokens: list[int]) -> bool:
    """Whether the guard lets every token through, one after another from the start."""
    state = START
    for token in tokens:
        if not _allowed(guard, state, token):
            return False
        state = guard.after(state, token)
    return state == START


def test_every_byte_pair_and_triple_as_python_decodes_them() -> None:
    """Single-byte tokens: a sequence passes exactly when it is well-formed UTF-8 to Python."""
    guard = Utf8Guard([bytes([b]) for b in range(256)], 8)
    leads = [0x41, 0x7F, 0x80, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF]
    tails = [0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0]
    for seq in itertools.chain(((a,) for a in leads), itertools.product(leads, tails),
                               itertools.product(leads, tails, tails), itertools.product([0xF0, 0xF4], tails, tails,
                                                                                           tails)):
        try:
            bytes(seq).decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert _walk(guard, list(seq)) == valid, bytes(seq)


def test_multi_byte_tokens_and_special_tokens() -> None:
    vocab = ["中".encode(), "中".encode()[:2], "中".encode()[2:], b"\xed\xa0", b"\xed\x9f", b"\xbf", b"", b"ab"]
    guard = Utf8Guard(vocab, 1)
    assert _walk(guard, [0, 7]) and _walk(guard, [1, 2]) and _walk(guard, [4, 5]) and _walk(guard, [6, 0, 6])
    assert not _walk(guard, [3]) and not _walk(guard, [2]) and not _walk(guard, [1, 7])
    assert _allowed(guard, 4, 31) and guard.after(4, 31) == 4  # ids past the vocabulary: no bytes, no change


@pytest.fixture(scope="module")
def tiny_with_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tiny_llama_folder(tmp_path_factory.mktemp("tiny-vocab"))
    tiny_tokenizer(folder)
    return folder


def test_a_sampler_drawn_to_surrogates_still_writes_a_valid_bounded_string(tiny_with_vocab: Path) -> None:
    """The byte-level vocabulary's tokens ranked so that greedy picks ED, then A0..BF (a surrogate, which
    xgrammar 0.2.9 accepts in a JSON string): the output must decode to valid, schema-valid JSON."""
    structured = StructuredOutputs(tiny_with_vocab, 512, 2)
    schema = {"type": "object", "properties": {"v": {"type": "string", "minLength": 3, "maxLength": 4}},
              "required": ["v"], "additionalProperties": False}
    spec = GrammarSpec("json_schema", json.dumps(schema))
    byte_token = {raw[0]: i for i, raw in enumerate(structured_vocab(structured)) if len(raw) == 1}
    scores = torch.zeros(512)
    for rank, byte in enumerate([0xED, *range(0xBF, 0x9F, -1), 0x80, 0x81]):
        scores[byte_token[byte]] = 100.0 - rank  # surrogate bytes first, the rest after
    out: list[int] = []
    for _ in range(40):
        chunk = ScheduledChunk("r", [5], 3, [0], True, SamplingParams(), len(out), 2, grammar=spec)
        logits = scores.clone().unsqueeze(0)
        structured.mask(logits, [chunk])
        token = int(logits[0].argmax())
        structured.advance([chunk], [token])
        out.append(token)
        if token == 2:
            break
    raw = b"".join(structured_vocab(structured)[t] for t in out[:-1])
    value = json.loads(raw.decode("utf-8"))  # strict: no ill-formed bytes
    jsonschema.validate(value, schema)
    assert raw.startswith(b'{"v": "\xed')  # the surrogate's lead was taken, its tail refused


def structured_vocab(structured: StructuredOutputs) -> list[bytes]:
    structured._get_compiler()
    return structured._tokenizer_info.decoded_vocab


def test_a_rolled_back_token_takes_its_utf8_state_with_it(tiny_with_vocab: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """"é" is two byte tokens here: after its lead only continuation bytes may follow; once that token
    is rolled back (the scheduler did not keep it), the start's tokens are allowed again, quietly."""
    structured = StructuredOutputs(tiny_with_vocab, 512, 2)
    spec = GrammarSpec("choice", json.dumps(["é", "ab"]))
    lead = next(i for i, raw in enumerate(structured_vocab(structured)) if raw == b"\xc3")

    def allowed(num_output: int) -> set[int]:
        logits = torch.zeros(1, 512)
        structured.mask(logits, [ScheduledChunk("r", [5], 3, [0], True, SamplingParams(), num_output, 2, grammar=spec)])
        return set(torch.nonzero(logits[0] == 0).flatten().tolist())

    first = allowed(0)
    assert lead in first
    structured.advance([ScheduledChunk("r", [5], 3, [0], True, SamplingParams(), 0, 2, grammar=spec)], [lead])
    assert lead not in allowed(1)
    assert allowed(0) == first
    assert "ill-formed" not in caplog.text
