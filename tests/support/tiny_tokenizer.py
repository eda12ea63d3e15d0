"""A byte-level BPE tokenizer.json sized for the tiny random Llama (tests/support/tiny_model.py), in milliseconds.

Structured-output tests need a real vocabulary beside the tiny model: `tiny_tokenizer(folder)` trains
one with the `tokenizers` library on a little JSON-like text (ids 0, 1, 2 are <pad>, <s>, </s>, matching
the tiny model's pad, BOS and EOS) and writes `tokenizer.json` into the model folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

_CORPUS = [
    json.dumps({"name": "Ada", "age": 36, "tags": ["x", "yz"], "ok": True, "score": -1.5, "none": None}),
    json.dumps({"city": "Paris", "temperature": 21, "unit": "celsius", "items": [1, 2, 3]}),
    '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>',
    "The quick brown fox jumps over the lazy dog. 0123456789 {}[],:\"\\",
]


def tiny_tokenizer(folder: Path, vocab_size: int = 512) -> Path:
    """Write `folder/tokenizer.json` (byte-level BPE, `vocab_size` tokens) and return its path."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    path = Path(folder) / "tokenizer.json"
    tok.save(str(path))
    return path
