"""Shared builders for model tests: tiny random Llama folders and engines over them, and the default
model's Hugging Face reference, loaded once per session.

Import the fixtures you use into a test module (`from tests.engine.model_fixtures import tiny_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.llm import LLM
from engine.scheduling.config import SchedulerConfig
from tests.support.tiny_model import tiny_llama_folder


@pytest.fixture(scope="session")
def hf_default_model() -> Any:
    """transformers' SmolLM2-135M in float32, loaded once per session (about 1.5 s a load on 2 busy cores) for
    every default-model parity test. Shared: read it only (`copy.deepcopy` it before merging an adapter in)."""
    from transformers import AutoModelForCausalLM

    from shared.model_store import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model("smollm2").path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 layers, hidden 64, 4 heads over 2 KV heads, tied embeddings, vocab 512."""
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny-llama"))


def make_llm(model: Path | str, *, blocks: int = 64, block_size: int = 4, budget: int = 32, seqs: int = 8,
             cpu_blocks: int = 64, dtype: str = "float32", max_model_len: int | None = None, **kwargs: Any) -> LLM:
    sched = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs, **kwargs)
    return LLM(str(model), dtype, num_device_blocks=blocks, num_cpu_blocks=cpu_blocks, block_size=block_size,
               scheduler=sched, max_model_len=max_model_len)


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    """Token ids in [3, vocab): no bos/eos/pad ids."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face's own greedy generate, one prompt at a time (no padding), EOS ignored."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
        do_sample=False, pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


def hf_greedy_mismatch(model: Any, prompts: list[list[int]], generated: list[list[int]]) -> int | None:
    """Hugging Face's greedy choices checked in one forward pass (teacher forcing) instead of one `generate`
    step per token: the first position where a generated token is not the argmax of the model's logits given
    the prompt and the tokens before it, or None. None holds exactly when `generate(do_sample=False)` with EOS
    ignored would give the same tokens (the first wrong token is preceded by the true greedy prefix, whose
    argmax is the true next token); a few times faster on the default model. `prompts` of one length are run
    as one batch (no padding), others one at a time."""
    batches = [[i] for i in range(len(prompts))] if len({len(p) for p in prompts}) > 1 else [list(range(len(prompts)))]
    for batch in batches:
        ids = torch.tensor([prompts[i] + generated[i] for i in batch])  # (B, prompt + new)
        with torch.no_grad():
            logits = model(ids, attention_mask=torch.ones_like(ids)).logits  # (B, prompt + new, vocab)
        start = len(prompts[batch[0]])
        picks = logits[:, start - 1:-1].argmax(-1)  # (B, new): the choice after each prefix
        wrong = (picks != ids[:, start:]).any(0).nonzero()
        if len(wrong):
            return int(wrong[0])
    return None
