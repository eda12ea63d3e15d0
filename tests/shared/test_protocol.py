"""The wire protocol: frozen bytes, round trips, append-only evolution, garbage rejected cleanly."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.model_info import AdapterInfo
from shared.protocol import (
    PROTOCOL_VERSION,
    Abort,
    AdapterReply,
    AddRequest,
    Bye,
    Error,
    Finished,
    GetStats,
    Hello,
    LoadAdapter,
    Message,
    ModelInfo,
    ModelUpdate,
    PriorityLoad,
    ProtocolError,
    Ready,
    SamplingDefault,
    Stats,
    StepOutputs,
    TenantLoad,
    TokenDelta,
    TokenLogprob,
    UnloadAdapter,
    Usage,
    decode,
    encode,
)
from shared.sampling import SamplingParams
from shared.structured import GrammarSpec

SAMPLES: dict[str, Message] = {
    "Hello": Hello(1, "gw-1"),
    "Ready": Ready(1, ModelInfo("smollm2", 8192, 16, 2, 1000, 49152)),
    "AddRequest": AddRequest(
        "req-1", [1, 2, 300], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=(2,)),
        priority=-1, tenant_id="acme", arrival_time=1700000000.25, weight=2.0, cache_salt="s",
    ),
    "Abort": Abort(["a", "b"]),
    "StepOutputs": StepOutputs(
        [TokenDelta("req-1", 0, [42, 70000], 3, 2, 0)], [Finished("req-1", 0, "length", Usage(3, 2, 0))], 9
    ),
    "Error": Error("req-1", "request", "token id 5 bad", code="request_rejected", param="prompt"),
    "GetStats": GetStats(),
    "Stats": Stats(1, 2, 3, 90, 100, 4, 5, 6, 7, 8, 2.5, 1, 0.5, 1.5, 10, 20, 30, 12, 2, 1, 50, 60, 1700000000.5,
                   [PriorityLoad(0, 1, 2)], [TenantLoad("t_1", 3, 40)]),
    "Bye": Bye("closing"),
    "LoadAdapter": LoadAdapter("c1", "sql", "/a/b"),
    "UnloadAdapter": UnloadAdapter("c2", "sql"),
    "AdapterReply": AdapterReply("c1", "bad", "request_rejected"),
    "ModelUpdate": ModelUpdate(ModelInfo("base", 64, 4, None, 8, 100, (), (AdapterInfo("sql", "base"),))),
}

# Frozen: a change here breaks every deployed peer. Append fields instead (with defaults).
GOLDEN_HEX = {
    "Hello": "930101a467772d31",
    "Ready": "9a0201a7736d6f6c6c6d32cd20001002cd03e8cdc0009090",
    "AddRequest": (
        "9b03a57265712d31930102cd012c89a16e01ab74656d7065726174757265cb0000000000000000a5746f705f70"
        "cb3ff0000000000000a5746f705f6b00a473656564c0aa6d61785f746f6b656e7308aa6d696e5f746f6b656e73"
        "00ae73746f705f746f6b656e5f6964739102aa69676e6f72655f656f73c2ffa461636d65cb41d954fc40100000"
        "cb4000000000000000a173c0a0"
    ),
    "Abort": "920492a161a162",
    "StepOutputs": "94059199a57265712d3100922ace000111700302009090009195a57265712d3100a66c656e67746893030200c009",
    "Error": (
        "9606a57265712d31a772657175657374ae746f6b656e206964203520626164b0726571756573745f72656a6563746564"
        "a670726f6d7074"
    ),
    "GetStats": "9107",
    "Stats": (
        "dc0022080102035a640405060708cb400400000000000001cb3fe0000000000000cb3ff80000000000000a141e0c0201323c"
        "cb41d954fc4020000091930001029193a3745f31032800909000000090cb0000000000000000"
    ),
    "Bye": "9209a7636c6f73696e67",
    "LoadAdapter": "940fa26331a373716ca42f612f62",
    "UnloadAdapter": "9310a26332a373716c",
    "AdapterReply": "9511a26331a3626164b0726571756573745f72656a656374656400",
    "ModelUpdate": "921298a4626173654004c00864909192a373716ca462617365",
}

# Frames of earlier versions of a message (before fields were appended): they must still decode,
# to the message with the appended fields at their defaults.
_STATS_V1 = Stats(1, 2, 3, 90, 100, 4, 5, 6, 7, 8, 2.5, 1)
OLDER_PEER_HEX = {
    "Error": ("9406a57265712d31a772657175657374af70726f6d707420746f6f206c6f6e67",  # before code
              Error("req-1", "request", "prompt too long")),
    "Error.param": ("9506a57265712d31a772657175657374af70726f6d707420746f6f206c6f6e67a0",  # before param
                    Error("req-1", "request", "prompt too long")),
    # before step_seconds, loop_seconds
    "Stats": ("9d080102035a640405060708cb400400000000000001", _STATS_V1),
    # before the token, prefix-cache, swap and start-time fields (the metrics of issue 12)
    "Stats with loop times": (
        "9f080102035a640405060708cb400400000000000001cb0000000000000000cb0000000000000000", _STATS_V1),
    # before the LoRA figures (issue 43)
    "Stats with loads": (
        "dc001a080102035a640405060708cb400400000000000001cb3fe0000000000000cb3ff80000000000000a141e0c0201323c"
        "cb41d954fc4020000091930001029193a3745f310328", SAMPLES["Stats"]),
    # an AdapterReply of success, before load_id
    "AdapterReply": ("9411a26331a0a0", AdapterReply("c1")),
    # before by_priority and by_tenant
    "Stats with token counts": (
        "dc0018080102035a640405060708cb400400000000000001cb3fe0000000000000cb3ff80000000000000a141e0c0201323c"
        "cb41d954fc40200000",
        Stats(1, 2, 3, 90, 100, 4, 5, 6, 7, 8, 2.5, 1, 0.5, 1.5, 10, 20, 30, 12, 2, 1, 50, 60, 1700000000.5)),
    # before adapters (the LoRA adapters of issue 43)
    "Ready.adapters": ("990201a7736d6f6c6c6d32cd20001002cd03e8cdc00090", SAMPLES["Ready"]),
    # before vocab_size, default_sampling
    "Ready": ("970201a7736d6f6c6c6d32cd20001002cd03e8", Ready(1, ModelInfo("smollm2", 8192, 16, 2, 1000))),
    "Ready.default_sampling": ("980201a7736d6f6c6c6d32cd20001002cd03e8cdc000",  # before default_sampling
                               Ready(1, ModelInfo("smollm2", 8192, 16, 2, 1000, 49152))),
    "AddRequest.lora_name": (  # before lora_name (the LoRA adapters of issue 43)
        "9a03a57265712d31930102cd012c89a16e01ab74656d7065726174757265cb0000000000000000a5746f705f70"
        "cb3ff0000000000000a5746f705f6b00a473656564c0aa6d61785f746f6b656e7308aa6d696e5f746f6b656e73"
        "00ae73746f705f746f6b656e5f6964739102aa69676e6f72655f656f73c2ffa461636d65cb41d954fc40100000"
        "cb4000000000000000a173c0", SAMPLES["AddRequest"]),
    "AddRequest": (  # before grammar
        "9903a57265712d31930102cd012c89a16e01ab74656d7065726174757265cb0000000000000000a5746f705f70"
        "cb3ff0000000000000a5746f705f6b00a473656564c0aa6d61785f746f6b656e7308aa6d696e5f746f6b656e73"
        "00ae73746f705f746f6b656e5f6964739102aa69676e6f72655f656f73c2ffa461636d65cb41d954fc40100000"
        "cb4000000000000000a173", SAMPLES["AddRequest"]),
    # a request using the sampling fields, before grammar
    "AddRequest with sampling fields": (
        "9903a57265712d3291018fa16e01ab74656d7065726174757265cb3ff0000000000000a5746f705f70cb3ff0000000000000a5746f"
        "705f6b00a473656564c0aa6d61785f746f6b656e7310aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa6967"
        "6e6f72655f656f73c2b070726573656e63655f70656e616c7479cb3fe0000000000000b16672657175656e63795f70656e616c7479"
        "cbbff0000000000000b272657065746974696f6e5f70656e616c7479cb3ff4000000000000a56d696e5f70cb3fc0000000000000aa"
        "6c6f6769745f62696173919207cb4059000000000000a86c6f6770726f62730200a0cb0000000000000000cb3ff0000000000000a0",
        AddRequest("req-2", [1], SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.25,
                                                min_p=0.125, logit_bias=((7, 100.0),), logprobs=2))),
    # its Finished before queue_seconds (the queue time of issue 12)
    "StepOutputs with logprobs": (
        "94059197a57265712d3100922ace00011170030200909194a57265712d3100a66c656e6774689303020009",
        SAMPLES["StepOutputs"]),
    # its TokenDelta before prompt_logprobs (h9) and num_unreturned_tokens (h10, best_of): the same frame
    "StepOutputs with logprobs, before prompt_logprobs": (
        "94059197a57265712d3100922ace00011170030200909195a57265712d3100a66c656e67746893030200c009",
        SAMPLES["StepOutputs"]),
    "StepOutputs with a token's logprobs, before prompt_logprobs": (
        "94059197a57265712d3200912a0101009193cbbfe0000000000000922a0792cbbfe0000000000000cbbff40000000000009003",
        StepOutputs([TokenDelta("req-2", 0, [42], 1, 1, 0, [TokenLogprob(-0.5, [42, 7], [-0.5, -1.25])])], [], 3)),
    # its TokenDelta with prompt_logprobs, before num_unreturned_tokens (best_of, issue 44)
    "StepOutputs with prompt_logprobs, before unreturned tokens": (
        "94059198a57265712d3100922ace0001117003020090909195a57265712d3100a66c656e67746893030200c009",
        SAMPLES["StepOutputs"]),
    "StepOutputs with a token's logprobs, before unreturned tokens": (
        "94059198a57265712d3200912a0101009193cbbfe0000000000000922a0792cbbfe0000000000000cbbff4000000000000909003",
        StepOutputs([TokenDelta("req-2", 0, [42], 1, 1, 0, [TokenLogprob(-0.5, [42, 7], [-0.5, -1.25])])], [], 3)),
    "StepOutputs with prompt logprobs, before unreturned tokens": (
        "94059198a57265712d3400912a030100909293cbbfe0000000000000910991cbbfd000000000000093cbc000000000000000910791"
        "cbc0000000000000009004",
        StepOutputs([TokenDelta("req-4", 0, [42], 3, 1, 0, [], [TokenLogprob(-0.5, [9], [-0.25]),
                                                                 TokenLogprob(-2.0, [7], [-2.0])])], [], 4)),
    # requests using h9's and h10's sampling fields, before lora_name (the LoRA adapters of issue 43)
    "AddRequest with allowed ids, bad words and prompt logprobs, before lora_name": (
        "9a03a57265712d3591018ca16e01ab74656d7065726174757265cb3ff0000000000000a5746f705f70cb3ff0000000000000a5746f"
        "705f6b00a473656564c0aa6d61785f746f6b656e7310aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa6967"
        "6e6f72655f656f73c2b1616c6c6f7765645f746f6b656e5f696473920304b36261645f776f7264735f746f6b656e5f696473929205"
        "069107af70726f6d70745f6c6f6770726f62730100a0cb0000000000000000cb3ff0000000000000a0c0",
        AddRequest("req-5", [1], SamplingParams(allowed_token_ids=(3, 4), bad_words_token_ids=((5, 6), (7,)),
                                                prompt_logprobs=1))),
    "AddRequest with beam search, before lora_name": (
        "9a03a17291018ca16e02ab74656d706572617475726500a5746f705f70cb3ff0000000000000a5746f705f6b00a473656564c0aa6d"
        "61785f746f6b656e7310aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa69676e6f72655f656f73c2a76265"
        "73745f6f6604af7573655f6265616d5f736561726368c3ae6561726c795f73746f7070696e67c300a0cb0000000000000000cb3ff0"
        "000000000000a0c0",
        AddRequest("r", [1], SamplingParams(n=2, best_of=4, use_beam_search=True, temperature=0, early_stopping=True))),
    # its TokenDelta before logprobs
    "StepOutputs": (
        "94059196a57265712d3100922ace000111700302009194a57265712d3100a66c656e6774689303020009", SAMPLES["StepOutputs"]),
}

# Messages using the fields appended for sampling features (logprobs, penalties, defaults), frozen too.
# A request that uses none of the new sampling fields encodes exactly as before (AddRequest above).
EXTENDED: dict[str, tuple[Message, str]] = {
    "Ready": (
        Ready(1, ModelInfo("smollm2", 8192, 16, 2, 1000, 49152, (SamplingDefault("temperature", 0.5),))),
        "9a0201a7736d6f6c6c6d32cd20001002cd03e8cdc0009192ab74656d7065726174757265cb3fe000000000000090",
    ),
    "Ready with adapters": (
        Ready(1, ModelInfo("base", 64, 4, None, 8, 100, (), (AdapterInfo("sql", "base"),))),
        "9a0201a4626173654004c00864909192a373716ca462617365",
    ),
    "AddRequest with an adapter": (
        AddRequest("req-4", [5], SamplingParams(max_tokens=4), lora_name="sql"),
        "9b03a57265712d34910589a16e01ab74656d7065726174757265cb3ff0000000000000a5746f705f70cb3ff0000000000000a574"
        "6f705f6b00a473656564c0aa6d61785f746f6b656e7304aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa"
        "69676e6f72655f656f73c200a0cb0000000000000000cb3ff0000000000000a0c0a373716c",
    ),
    "AddRequest": (
        AddRequest("req-2", [1], SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.25,
                                                min_p=0.125, logit_bias=((7, 100.0),), logprobs=2)),
        "9b03a57265712d3291018fa16e01ab74656d7065726174757265cb3ff0000000000000a5746f705f70cb3ff0000000000000a5746f"
        "705f6b00a473656564c0aa6d61785f746f6b656e7310aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa6967"
        "6e6f72655f656f73c2b070726573656e63655f70656e616c7479cb3fe0000000000000b16672657175656e63795f70656e616c7479"
        "cbbff0000000000000b272657065746974696f6e5f70656e616c7479cb3ff4000000000000a56d696e5f70cb3fc0000000000000aa"
        "6c6f6769745f62696173919207cb4059000000000000a86c6f6770726f62730200a0cb0000000000000000cb3ff0000000000000a0c0a0"
    ),  # (the trailing c0 a0: the grammar and lora_name, appended after; frames without them are in OLDER_PEER_HEX)
    "Finished with queue time": (
        StepOutputs([], [Finished("req-3", 1, "stop", Usage(5, 4, 2), 0.25)], 7),
        "9405909195a57265712d3301a473746f7093050402cb3fd000000000000007",
    ),
    "StepOutputs": (
        StepOutputs([TokenDelta("req-2", 0, [42], 1, 1, 0, [TokenLogprob(-0.5, [42, 7], [-0.5, -1.25])])], [], 3),
        "94059199a57265712d3200912a0101009193cbbfe0000000000000922a0792cbbfe0000000000000cbbff400000000000090009003",
    ),
    "StepOutputs with prompt logprobs": (
        StepOutputs([TokenDelta("req-4", 0, [42], 3, 1, 0, [], [TokenLogprob(-0.5, [9], [-0.25]),
                                                                 TokenLogprob(-2.0, [7], [-2.0])])], [], 4),
        "94059199a57265712d3400912a030100909293cbbfe0000000000000910991cbbfd000000000000093cbc000000000000000910791"
        "cbc000000000000000009004",
    ),
    "AddRequest with allowed ids, bad words and prompt logprobs": (
        AddRequest("req-5", [1], SamplingParams(allowed_token_ids=(3, 4), bad_words_token_ids=((5, 6), (7,)),
                                                prompt_logprobs=1)),
        "9b03a57265712d3591018ca16e01ab74656d7065726174757265cb3ff0000000000000a5746f705f70cb3ff0000000000000a5746f"
        "705f6b00a473656564c0aa6d61785f746f6b656e7310aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa6967"
        "6e6f72655f656f73c2b1616c6c6f7765645f746f6b656e5f696473920304b36261645f776f7264735f746f6b656e5f696473929205"
        "069107af70726f6d70745f6c6f6770726f62730100a0cb0000000000000000cb3ff0000000000000a0c0a0",
    ),
    "AddRequest with beam search": (  # early_stopping travels as a bool or a string ("never")
        AddRequest("r", [1], SamplingParams(n=2, best_of=4, use_beam_search=True, temperature=0,
                                            early_stopping=True)),
        "9b03a17291018ca16e02ab74656d706572617475726500a5746f705f70cb3ff0000000000000a5746f705f6b00a473656564c0aa6d"
        "61785f746f6b656e7310aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69647390aa69676e6f72655f656f73c2a76265"
        "73745f6f6604af7573655f6265616d5f736561726368c3ae6561726c795f73746f7070696e67c300a0cb0000000000000000cb3ff0"
        "000000000000a0c0a0",
    ),
    "Stats with LoRA figures": (
        Stats(1, 2, 3, 90, 100, 4, 5, 6, 7, 8, 2.5, 1, 0.5, 1.5, 10, 20, 30, 12, 2, 1, 50, 60, 1700000000.5,
              [PriorityLoad(0, 1, 2)], [TenantLoad("t_1", 3, 40)], 4, ["sql"], ["chat", "sql"], 3, 2, 1,
              [0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2], 0.0625),
        "dc0022080102035a640405060708cb400400000000000001cb3fe0000000000000cb3ff80000000000000a141e0c0201323c"
        "cb41d954fc4020000091930001029193a3745f3103280491a373716c92a463686174a373716c0302019c0001020202020202"
        "02020202cb3fb0000000000000",
    ),
    "AdapterReply with a load id": (AdapterReply("c3", load_id=7), "9511a26333a0a007"),
    "StepOutputs with unreturned tokens": (
        StepOutputs([TokenDelta("req-4", 0, [42, 7], 1, 2, 0, num_unreturned_tokens=5)], [], 4),
        "94059199a57265712d3400922a070102009090059004",
    ),
}


def test_protocol_version_is_one() -> None:
    assert PROTOCOL_VERSION == 1


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_bytes(name: str) -> None:
    assert encode(SAMPLES[name]).hex() == GOLDEN_HEX[name]


@pytest.mark.parametrize("name", sorted(EXTENDED))
def test_golden_bytes_of_appended_fields(name: str) -> None:
    msg, golden = EXTENDED[name]
    assert encode(msg).hex() == golden
    assert decode(bytes.fromhex(golden)) == msg


def test_a_bad_logit_bias_entry_is_named() -> None:
    raw = _raw(EXTENDED["AddRequest"][0])
    raw[3]["logit_bias"] = [[7, "x"]]
    with pytest.raises(ProtocolError, match=r"AddRequest.sampling.logit_bias\[\]\[1\]: expected float"):
        decode(msgpack.packb(raw))
    raw[3]["logit_bias"] = [[7, 500.0]]
    with pytest.raises(ProtocolError, match=r"AddRequest.sampling.logit_bias: logit_bias values"):
        decode(msgpack.packb(raw))


def test_golden_bytes_of_a_request_with_a_grammar() -> None:
    """The grammar travels as a nested array [kind, value] after cache_salt."""
    msg = AddRequest("req-2", [5], SamplingParams(max_tokens=4),
                     grammar=GrammarSpec("json_schema", '{"type":"object"}'))
    golden = (
        "9b03a57265712d32910589a16e01ab74656d7065726174757265cb3ff0000000000000a5746f705f70cb3ff0000000000000"
        "a5746f705f6b00a473656564c0aa6d61785f746f6b656e7304aa6d696e5f746f6b656e7300ae73746f705f746f6b656e5f69"
        "647390aa69676e6f72655f656f73c200a0cb0000000000000000cb3ff0000000000000a092ab6a736f6e5f736368656d61b1"
        "7b2274797065223a226f626a656374227da0"
    )
    assert encode(msg).hex() == golden
    assert decode(bytes.fromhex(golden)) == msg
    bad = msgpack.unpackb(bytes.fromhex(golden))
    bad[-2][0] = "lisp"
    with pytest.raises(ProtocolError, match="AddRequest.grammar.kind"):
        decode(msgpack.packb(bad))


@pytest.mark.parametrize("name", sorted(OLDER_PEER_HEX))
def test_frames_of_older_peers_still_decode(name: str) -> None:
    frame, expected = OLDER_PEER_HEX[name]
    assert decode(bytes.fromhex(frame)) == expected


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(name: str) -> None:
    assert decode(encode(SAMPLES[name])) == SAMPLES[name]


def test_every_message_type_has_a_golden_sample() -> None:
    from shared import protocol

    assert {cls.__name__ for cls in protocol._TOP_LEVEL} == set(SAMPLES)


def _raw(msg: Message) -> list:
    return msgpack.unpackb(encode(msg))


def test_extra_trailing_fields_from_a_newer_peer_are_ignored() -> None:
    frame = msgpack.packb([*_raw(SAMPLES["Hello"]), "future field", 7])
    assert decode(frame) == SAMPLES["Hello"]
    nested = _raw(SAMPLES["StepOutputs"])
    nested[1][0].append("future delta field")
    assert decode(msgpack.packb(nested)) == SAMPLES["StepOutputs"]


def test_sampling_keys_from_a_newer_peer_are_ignored() -> None:
    raw = _raw(SAMPLES["AddRequest"])
    raw[3]["frequency_penalty_v9"] = 0.5
    assert decode(msgpack.packb(raw)) == SAMPLES["AddRequest"]


def test_missing_trailing_fields_with_defaults_are_filled() -> None:
    old = AddRequest("r", [5], SamplingParams())
    raw = _raw(old)[:4]  # an older peer sent only request_id, prompt, sampling
    assert decode(msgpack.packb(raw)) == old
    assert decode(msgpack.packb([5, [], []])) == StepOutputs([], [], 0)


def test_missing_required_field_is_named() -> None:
    with pytest.raises(ProtocolError, match=r"Ready.model: missing field 'block_size'"):
        decode(msgpack.packb(_raw(SAMPLES["Ready"])[:4]))
    with pytest.raises(ProtocolError, match=r"Ready.model: missing field 'model_name'"):
        decode(msgpack.packb(_raw(SAMPLES["Ready"])[:2]))


def test_ready_carries_the_model_info_inline() -> None:
    """Ready's frame is [tag, protocol_version, *ModelInfo's fields]: the record's fields are Ready's
    (the same bytes as when they were declared on Ready), and a newer engine's appended ones are ignored."""
    info = ModelInfo("m", 64, 4, None, 8, 100, (SamplingDefault("top_p", 0.5),))
    assert _raw(Ready(1, info)) == [2, 1, "m", 64, 4, None, 8, 100, [["top_p", 0.5]], []]
    assert decode(msgpack.packb([2, 1, "m", 64, 4, None, 8, 100, [["top_p", 0.5]], [], "future field"])) \
        == Ready(1, info)


@pytest.mark.parametrize(
    ("name", "position", "bad", "match"),
    [
        ("Hello", 1, "1", r"Hello.protocol_version: expected int, got str"),
        ("Hello", 1, True, r"Hello.protocol_version: expected int, got bool"),
        ("Hello", 2, None, r"Hello.gateway_id: expected str"),
        ("Ready", 3, "long", r"Ready.model.max_model_len: expected int"),
        ("Ready", 8, [["top_p", "x"]], r"Ready.model.default_sampling\[\].value: expected float"),
        ("AddRequest", 2, [1, "x"], r"AddRequest.prompt_token_ids\[\]: expected int"),
        ("AddRequest", 2, {"a": 1}, r"AddRequest.prompt_token_ids: expected array"),
        ("AddRequest", 3, [1], r"AddRequest.sampling: expected map"),
        ("AddRequest", 6, "now", r"AddRequest.arrival_time: expected float"),
        ("Abort", 1, [b"bytes"], r"Abort.request_ids\[\]: expected str, got bytes"),
        ("StepOutputs", 1, [[1]], r"StepOutputs.deltas: expected TokenDelta array|request_id"),
        ("StepOutputs", 2, [["r", 0, "fine", {}]], r"StepOutputs.finished\[\].reason: expected stop"),
        ("Error", 2, "fatal", r"Error.kind: expected request \| engine"),
        ("Stats", 11, "2.5", r"Stats.mean_requests_per_step: expected float"),
    ],
)
def test_wrong_field_types_are_rejected_with_the_field_named(name: str, position: int, bad: object, match: str) -> None:
    raw = _raw(SAMPLES[name])
    raw[position] = bad
    with pytest.raises(ProtocolError, match=match):
        decode(msgpack.packb(raw))


def test_integer_is_accepted_for_a_float_field() -> None:
    raw = _raw(SAMPLES["AddRequest"])
    raw[6] = 17
    msg = decode(msgpack.packb(raw))
    assert isinstance(msg, AddRequest) and msg.arrival_time == 17.0 and type(msg.arrival_time) is float


def test_bad_sampling_is_a_protocol_error_that_names_the_request() -> None:
    raw = _raw(SAMPLES["AddRequest"])
    raw[3]["temperature"] = 9.0
    with pytest.raises(ProtocolError, match=r"AddRequest.sampling.temperature: temperature must be") as e:
        decode(msgpack.packb(raw))
    assert e.value.request_id == "req-1"
    raw[3]["temperature"] = "hot"
    with pytest.raises(ProtocolError, match=r"sampling.temperature: expected float") as e:
        decode(msgpack.packb(raw))
    assert e.value.request_id == "req-1"


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"", "not a msgpack frame"),
        (b"\xc1", "not a msgpack frame"),
        (b"\x93\x01\x02", "not a msgpack frame"),  # array of 3 with 2 elements: truncated
        (encode(Hello(1, "gw"))[:-1], "not a msgpack frame"),
        (encode(Hello(1, "gw")) + b"\x00", "not a msgpack frame"),  # trailing garbage
        (msgpack.packb(7), "expected a non-empty array"),
        (msgpack.packb([]), "expected a non-empty array"),
        (msgpack.packb([99, 1]), "unknown message tag 99"),
        (msgpack.packb(["Hello", 1, "gw"]), "unknown message tag 'Hello'"),
        (msgpack.packb([10, "r", 0, [], 1, 1, 0]), "unknown message tag 10"),  # nested types are not messages
        (msgpack.packb({"a": 2}), "expected a non-empty array"),
        (msgpack.packb({1: 2}), "not a msgpack frame"),  # only string map keys
    ],
)
def test_garbage_frames_raise_protocol_error(frame: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_protocol_error(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(frame)


_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=5), st.binary(max_size=5),
)
_values = st.recursive(
    _leaves, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 13), st.lists(_values, max_size=14))
def test_structured_garbage_never_raises_anything_but_protocol_error(tag: int, fields: list) -> None:
    try:
        msg = decode(msgpack.packb([tag, *fields]))
    except ProtocolError:
        return
    assert decode(encode(msg)) == msg  # whatever was accepted is a valid, re-encodable message


def test_early_stopping_is_a_bool_or_a_string_on_the_wire() -> None:
    never = AddRequest("r", [1], SamplingParams(n=2, use_beam_search=True, temperature=0, early_stopping="never"))
    assert decode(encode(never)) == never
    frame = msgpack.unpackb(encode(never))
    frame[3]["early_stopping"] = 3
    with pytest.raises(ProtocolError, match=r"AddRequest.sampling.early_stopping: expected bool \| str, got int"):
        decode(msgpack.packb(frame))
