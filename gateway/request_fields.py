"""Which top-level request fields are honoured, refused or ignored: one table, read by schemas.py.

The policy (vLLM's, for the clients and load generators that send its extensions):

- a field the request model declares is validated strictly and honoured;
- a field in `REFUSED_UNLESS_NEUTRAL` is one we know and cannot honour: its
  default/no-op value (or null) is accepted, anything else is a 400 naming it;
- any other top-level field is accepted and ignored, and its *name* (never its
  value) is logged as a warning. `KNOWN_IGNORED` lists the ones we know to be
  harmless (informational, or meaningless for this model), for the README.

Nested objects (messages, stream_options) stay strict: an unknown key there is a
400. When a field becomes supported, add it to the request model and delete its
entry here. This module knows nothing about HTTP, tokenizers or the engine.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.errors import InvalidRequest

log = logging.getLogger("pageserve.gateway")

REFUSED_UNLESS_NEUTRAL: dict[str, tuple[Any, ...]] = {
    # OpenAI sampling and output options not implemented yet.
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "suffix": ("",),
    # vLLM's extensions that change the tokens, the prompt or the response body.
    "watermarking": (False,),
    "logprob_token_ids": (),
    "documents": (),
    "chat_template": (),
    "priority": (0,),
    "cache_salt": (),
    "return_tokens_as_token_ids": (False,),
    "repetition_detection": (),
    "prompt_embeds": (),
    "thinking_token_budget": (),
}
"""Known fields we cannot honour: accepted only at these values or null, else a 400 naming them."""

NEUTRAL_BY_ENDPOINT: dict[str, dict[str, tuple[Any, ...]]] = {
    "chat": {"add_special_tokens": (False,), "echo": (False,)},
    "completion": {"add_special_tokens": (True,), "add_generation_prompt": (True,),
                   "continue_final_message": (False,), "chat_template_kwargs": ({},)},
}
"""Neutral values that differ between the two endpoints (the chat template writes its own BOS)."""

KNOWN_IGNORED = (
    "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
    "safety_identifier", "verbosity", "reasoning_effort", "include_reasoning", "request_id", "session_id",
    "stream_interval", "truncation_side", "mm_processor_kwargs", "media_io_kwargs", "kv_transfer_params",
    "ec_transfer_params", "vllm_xargs", "routed_experts_prompt_start", "return_token_offsets",
    "return_prompt_text", "return_mm_kwargs",
)
"""Accepted and ignored like any unknown field; listed because we checked that ignoring them is harmless."""

_MAX_LOGGED_NAMES = 8
_MAX_NAME_CHARS = 48


def split_fields(body: dict[str, Any], declared: set[str], endpoint: str) -> dict[str, Any]:
    """The body's declared fields; a 400 for a refused one; a warning naming the ignored ones."""
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    neutral_here = NEUTRAL_BY_ENDPOINT.get(endpoint, {})
    for name, value in body.items():
        if name in declared:
            kept[name] = value
        elif name in neutral_here or name in REFUSED_UNLESS_NEUTRAL:
            neutral = neutral_here.get(name, REFUSED_UNLESS_NEUTRAL.get(name, ()))
            if not _is_neutral(value, neutral):
                raise InvalidRequest(f"unsupported parameter: {name} is not supported by this server",
                                     param=name, code="unsupported_parameter")
        else:
            ignored.append(name)
    if ignored:
        log.warning("ignored request fields: %s", _names_for_log(ignored))
    return kept


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # type() equality: True == 1 in Python, but `"best_of": true` is no neutral value.
    return value is None or any(type(value) is type(v) and value == v for v in neutral)


def _names_for_log(names: list[str]) -> str:
    """Names only (never values), bounded: a client chooses them, so they are cut and escaped."""
    shown = [ascii(n[:_MAX_NAME_CHARS]) for n in names[:_MAX_LOGGED_NAMES]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more > 0 else "")
