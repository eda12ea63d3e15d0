"""What a constrained request asks the engine to obey: one grammar spec per request.

The gateway turns `response_format`, vLLM's `structured_outputs` / `guided_*` fields and
forced tool calls into one `GrammarSpec`; the wire protocol carries it on `AddRequest`;
the engine compiles it (engine/worker/structured_outputs.py) and masks the logits of that
request's rows with it. Pure Python: no torch, no grammar library here.

    kind          value
    json_object   ""                          any JSON object
    json_schema   the schema as JSON text     a JSON document valid against it
    regex         the pattern                 text matching it (xgrammar's regex dialect)
    choice        a JSON array of strings     exactly one of them
    grammar       EBNF text                   text of the grammar (GBNF, as vLLM's guided_grammar)
    tool_call     a JSON array of {"name", "parameters"}
                                              one call of one of those functions, in the Hermes
                                              format: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_call"]
GRAMMAR_KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "choice", "grammar", "tool_call")

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
"""The tags around one call in the Hermes format (SmolLM2, Qwen2.5, Hermes 2/3, SmolLM3)."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    value: str = ""
    """See the table in the module docstring; equal specs share one compiled grammar."""
