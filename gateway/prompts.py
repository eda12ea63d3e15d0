"""Text in, token ids out: the tokenizer, the chat template and prompt checks.

Owns loading the model's tokenizer (`gateway/tokenizer.py`, from the same
`resolve_model` folder the engine loads its weights from) and turning chat messages or a completion prompt
into token ids. Tokenizing a long prompt is CPU work, so it runs in a worker
thread (the fast tokenizer releases the GIL) and never stalls other streams.
It knows nothing about HTTP or the engine.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from gateway.errors import InvalidRequest
from gateway.output_options import TemplateOptions
from gateway.tokenizer import ChatTemplateError, TextTokenizer
from gateway.tools import ToolPlan, template_knows_tools, tool_prompt_messages
from shared.model_store import resolve_model


class Prompts:
    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    @classmethod
    async def load(cls, model_spec: str) -> Prompts:
        """Load the tokenizer of `model_spec` (a few seconds: done once, in the lifespan)."""

        def _load() -> TextTokenizer:
            return TextTokenizer.from_folder(resolve_model(model_spec).path)

        return cls(await anyio.to_thread.run_sync(_load))

    async def chat(self, messages: list[dict[str, Any]], tools: ToolPlan | None = None,
                   add_generation_prompt: bool = True, add_special_tokens: bool = False,
                   template: TemplateOptions | None = None) -> list[int]:
        if template is None:
            template = TemplateOptions(add_generation_prompt=add_generation_prompt)
        return await anyio.to_thread.run_sync(self._chat, messages, tools, template, add_special_tokens)

    def _chat(self, messages: list[dict[str, Any]], tools: ToolPlan | None,
              template: TemplateOptions, add_special_tokens: bool = False) -> list[int]:
        if self.tokenizer.chat_template is None:
            raise InvalidRequest("this model has no chat template; use /v1/completions", param="messages")
        offered = tools.tools if tools is not None and tools.choice != "none" else None
        if not template_knows_tools(self.tokenizer.chat_template):
            # The template renders role and content only: tools, calls and results go in as text.
            messages, offered = tool_prompt_messages(messages, tools), None
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=template.add_generation_prompt, tools=offered,
                continue_final_message=template.continue_final_message, template_kwargs=template.kwargs)
        except ChatTemplateError as e:  # the template's own checks (role order...)
            raise InvalidRequest(f"messages do not fit the model's chat template: {e}", param="messages") from None
        # The template already wrote the special tokens (BOS, <|im_start|>...).
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    async def completion(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):  # ids are checked against the engine's vocabulary in serving.plan
            return list(prompt)
        if not prompt:
            raise InvalidRequest("prompt must not be empty", param="prompt")
        return list(await anyio.to_thread.run_sync(self._encode, prompt))

    async def text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`text` tokenized as it is (no emptiness rule: /tokenize of "" is [] or [BOS])."""
        return list(await anyio.to_thread.run_sync(self._encode, text, add_special_tokens))

    def _encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def check_vocab(self, token_ids: list[int], param: str) -> None:
        """A 400 naming `param` when an id is outside the vocabulary (it would index past a tensor)."""
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary (size {self.vocab_size})", param=param)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await anyio.to_thread.run_sync(self._decode, token_ids)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def token_strings(self, token_ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(t) for t in token_ids]
