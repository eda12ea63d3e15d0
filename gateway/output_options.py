"""vLLM's per-request options that shape the prompt and the response text rather than the sampling.

    field                         where it acts
    include_stop_str_in_output    gateway/stop_strings.py keeps the matched stop string
    skip_special_tokens           gateway/detokenizer.py (false: special tokens stay in the text)
    spaces_between_special_tokens accepted, no effect: the fast tokenizer decodes the same either way
                                  (vLLM's fast-tokenizer path ignores it too)
    bad_words                     tokenized here (`bad_words_token_ids`), banned by the engine's sampler
    truncate_prompt_tokens        the prompt's last k tokens are kept (`truncate_prompt`)
    return_token_ids              prompt and choice token ids in the response (gateway/openai_format.py)
    echo (completions)            the prompt's text (and logprobs) before the completion's
    max_tokens 0 (with echo)      prompt only: the engine samples one token, which is dropped and not counted

The chat template's options (add_generation_prompt, continue_final_message, chat_template_kwargs)
are `TemplateOptions`, passed to gateway/prompts.py. Knows nothing about HTTP or the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.errors import InvalidRequest


@dataclass(frozen=True)
class OutputOptions:
    include_stop_str: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    echo: bool = False
    """Completions: the prompt's text comes first in each choice (and its logprobs, with logprobs)."""
    prompt_only: bool = False
    """max_tokens 0 with echo: no completion at all (lm-evaluation-harness's loglikelihood requests)."""
    bad_words: tuple[str, ...] = ()
    truncate_prompt_tokens: int | None = None
    """Keep the prompt's last k tokens (-1: the model's context)."""

    def __post_init__(self) -> None:
        if self.truncate_prompt_tokens == 0:
            raise InvalidRequest("truncate_prompt_tokens must be positive, or -1 for the model's context",
                                 param="truncate_prompt_tokens")


@dataclass(frozen=True)
class TemplateOptions:
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    """The last (assistant) message is left open for the model to continue (no end-of-turn token)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """chat_template_kwargs: extra variables for the template (e.g. enable_thinking)."""

    @classmethod
    def of(cls, add_generation_prompt: bool | None, continue_final_message: bool | None,
           kwargs: dict[str, Any] | None, messages: list[dict[str, Any]]) -> TemplateOptions:
        """From a chat body's fields (vLLM's defaults: a generation prompt, unless continuing)."""
        if continue_final_message and messages[-1]["role"] != "assistant":
            raise InvalidRequest("continue_final_message needs a last message from the assistant",
                                 param="continue_final_message")
        add = add_generation_prompt if add_generation_prompt is not None else not continue_final_message
        return cls(add_generation_prompt=add,
                   continue_final_message=bool(continue_final_message), kwargs=kwargs or {})

    def __post_init__(self) -> None:
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequest("continue_final_message and add_generation_prompt cannot both be true",
                                 param="continue_final_message")


class Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


def allowed_ids(ids: list[int]) -> tuple[int, ...]:
    """vLLM refuses an empty allowed_token_ids (nothing could be sampled)."""
    if not ids:
        raise InvalidRequest("allowed_token_ids must not be empty", param="allowed_token_ids")
    return tuple(ids)


def bad_words_token_ids(words: Sequence[str], tokenizer: Encoder) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of bad_words: each word as it is, and with a leading space when that makes
    a different first token of the same length (the word in the middle of a sentence)."""
    out: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not bare:
            raise InvalidRequest("a bad word must contain text", param="bad_words")
        out.append(bare)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return tuple(out)


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """The last `keep` tokens (vLLM's truncate_prompt_tokens; -1 keeps the model's context)."""
    if keep is None:
        return token_ids
    limit = max_model_len if keep == -1 else keep
    return token_ids[-limit:]
