"""What a response says about its prompt: echo, prompt logprobs and token ids (vLLM's shapes).

    completions echo            each choice's text starts with the prompt's text; with logprobs, the
                                prompt's tokens lead `tokens`/`token_logprobs`/..., the first with null
                                (nothing precedes it), as lm-evaluation-harness reads them
    prompt_logprobs             vLLM's list: null, then per prompt token {id: {logprob, rank?, decoded_token}}
                                with the prompt's own token and the k most likely (rank known for those)
    return_token_ids            prompt_token_ids (chat: top level; completions: per choice) and token_ids

The engine's prompt logprobs cover tokens 1.. of the prompt (shared/protocol.py TokenDelta).
Nothing here knows HTTP or the engine; the texts come from the tokenizer one id at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.protocol import TokenLogprob

TextOf = Callable[[int], str]


def prompt_logprobs_body(prompt_ids: list[int], lps: list[TokenLogprob], text_of: TextOf) -> list[Any]:
    """vLLM's `prompt_logprobs`: [None, {"id": {"logprob", "rank", "decoded_token"}}, ...]."""
    out: list[Any] = [None]
    for token_id, lp in zip(prompt_ids[1:], lps, strict=False):
        entry: dict[str, Any] = {}
        for rank, (t, v) in enumerate(zip(lp.top_token_ids, lp.top_logprobs, strict=True), start=1):
            entry[str(t)] = {"logprob": v, "rank": rank, "decoded_token": text_of(t)}
        if str(token_id) not in entry:  # the prompt's own token, outside the k best: its rank is not computed
            entry[str(token_id)] = {"logprob": lp.logprob, "rank": None, "decoded_token": text_of(token_id)}
        out.append(entry)
    return out


def echo_logprobs(prompt_ids: list[int], lps: list[TokenLogprob], text_of: TextOf) -> dict[str, list[Any]]:
    """The prompt's part of completions' logprobs lists (first token: null logprob and alternatives)."""
    tokens = [text_of(t) for t in prompt_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [None] + [lp.logprob for lp in lps],
        "top_logprobs": [None] + [{text_of(t): v for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)}
                                  for lp in lps],
        "text_offset": offsets,
    }


def echo_choice(choice: dict[str, Any], prompt_text: str, prompt_part: dict[str, list[Any]] | None,
                prompt_only: bool) -> None:
    """A completions choice (whole or a stream's first chunk) with the prompt in front, in place."""
    choice["text"] = prompt_text + ("" if prompt_only else choice["text"])
    if prompt_part is None:
        return
    rest = choice.get("logprobs") if not prompt_only else None
    merged = {k: list(v) for k, v in prompt_part.items()}
    if rest:
        for key in ("tokens", "token_logprobs", "top_logprobs"):
            merged[key] += rest[key]
        merged["text_offset"] += [o + len(prompt_text) for o in rest["text_offset"]]
    choice["logprobs"] = merged


def prompt_fields(body: dict[str, Any], choice: dict[str, Any], chat: bool, prompt_ids: list[int] | None,
                  prompt_logprobs: list[Any] | None) -> None:
    """prompt_token_ids and prompt_logprobs where vLLM puts them: chat's top level, completions' choice."""
    target = body if chat else choice
    if prompt_ids is not None:
        target["prompt_token_ids"] = prompt_ids
    if prompt_logprobs is not None:
        target["prompt_logprobs"] = prompt_logprobs
