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

    async def chat(self, messages: list[dict[str, Any]], tools: ToolPlan | None = None) -> list[int]:
        return await anyio.to_thread.run_sync(self._chat, messages, tools)

    def _chat(self, messages: list[dict[str, Any]], tools: ToolPlan | None = None) -> list[int]:
        if self.tokenizer.chat_template is None:
            raise InvalidRequest("this model has no chat template; use /v1/completions", param="messages")
        offered = tools.tools if tools is not None and tools.choice != "none" else None
        if not template_knows_tools(self.tokenizer.chat_template):
            # The template renders role and content only: tools, calls and results go in as text.
            messages, offered = tool_prompt_messages(messages, tools), None
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=offered)
        except ChatTemplateError as e:  # the template's own checks (role order...)
            raise InvalidRequest(f"messages do not fit the model's chat template: {e}", param="messages") from None
        # The template already wrote the special tokens (BOS, <|im_start|>...).
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def completion(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            bad = next((t for t in prompt if t >= self.vocab_size), None)
            if bad is not None:
                raise InvalidRequest(f"token id {bad} is outside the vocabulary (size {self.vocab_size})",
                                     param="prompt")
            return list(prompt)
        if not prompt:
            raise InvalidRequest("prompt must not be empty", param="prompt")
        return list(await anyio.to_thread.run_sync(self._encode, prompt))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))
