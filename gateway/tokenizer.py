"""The model's tokenizer for the gateway, without transformers (and so without torch).

Owns reading a Hugging Face model folder's `tokenizer.json` with the `tokenizers`
library and rendering its chat template with a sandboxed jinja2 environment set
up the way transformers' `apply_chat_template` sets it up (trim/lstrip blocks,
loop controls, `tojson`, `raise_exception`, `strftime_now`). Importing
transformers costs the gateway ~7 s and a torch import at start-up; this takes
~0.4 s. A test checks it against `AutoTokenizer` token for token.

It knows nothing about HTTP, the engine or stop strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers


class ChatTemplateError(ValueError):
    """The messages do not fit the template (its own `raise_exception`, or a render error)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters, which templates do not expect.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class TextTokenizer:
    def __init__(self, tokenizer: tokenizers.Tokenizer, config: dict[str, Any], chat_template: str | None) -> None:
        self._tok = tokenizer
        self._special_tokens = {
            name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        self.chat_template = chat_template
        self._template = _compile_template(chat_template) if chat_template else None
        eos = self._special_tokens["eos_token"]
        self.eos_token_id: int | None = tokenizer.token_to_id(eos) if eos else None

    @classmethod
    def from_folder(cls, path: Path) -> TextTokenizer:
        tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        return cls(tok, config, _chat_template_source(path, config))

    def __len__(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True, **_: Any) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of `token_id` (BPE pieces as stored: "Ġthe")."""
        return str(self._tok.id_to_token(token_id) or "")

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, continue_final_message: bool = False,
                            template_kwargs: dict[str, Any] | None = None) -> str:
        """The rendered prompt text (special tokens written by the template itself). `template_kwargs`
        (chat_template_kwargs) are extra template variables; they never replace the ones set here.
        `continue_final_message`: the text ends with the last message's content, its end-of-turn cut
        (transformers' rule: cut after the last occurrence of the stripped content)."""
        if self._template is None:
            raise ChatTemplateError("this model has no chat template")
        # The client's variables never shadow the template's helpers (raise_exception, strftime_now...).
        extra = {k: v for k, v in (template_kwargs or {}).items() if k not in self._template.environment.globals}
        variables = {**extra, "messages": messages, "add_generation_prompt": add_generation_prompt,
                     "tools": tools, "documents": None, **self._special_tokens}
        try:
            text = self._template.render(**variables)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(str(e)) from None
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # chat_template_kwargs of the wrong type
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from None
        if continue_final_message:
            final = str(messages[-1].get("content") or "").strip()
            if not final or final not in text:
                raise ChatTemplateError("the final message's content is not in the rendered template")
            text = text[: text.rindex(final) + len(final)]
        return text


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template_source(path: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one serves chat
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if isinstance(template, str):
        return template
    jinja_file = path / "chat_template.jinja"
    return jinja_file.read_text() if jinja_file.is_file() else None
