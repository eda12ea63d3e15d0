"""`tools` and `tool_choice` of a chat request: checked, turned into a grammar when a call is forced,
and written into the prompt for chat templates that know nothing of tools.

    tool_choice   what happens
    none          the tools stay out of the prompt and the output is plain text
    auto          the tools are in the prompt; the model's own calls are parsed (gateway/tool_parser.py)
    required      the output is constrained to one call of one of the tools (GrammarSpec "tool_call")
    {"type": "function", "function": {"name": f}}   constrained to one call of f

The call format is Hermes' (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`), the one
SmolLM2, Qwen2.5, Hermes 2/3 and SmolLM3 were trained on. A template that renders `tools` itself
gets them as they are; for one that does not (SmolLM2-135M's), `tool_prompt_messages` puts the
tool list into the system message and writes earlier calls and tool results as text in that
format, so a conversation continues after a call. Never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidRequest
from gateway.response_format import checked_schema
from shared.structured import TOOL_CALL_END, TOOL_CALL_START, GrammarSpec

ToolChoice = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]]
    """The request's tools as OpenAI shapes them ({"type": "function", "function": {...}})."""
    choice: ToolChoice
    grammar: GrammarSpec | None
    """Set when a call is forced (required / named)."""

    @property
    def parse_calls(self) -> bool:
        return self.choice != "none"


def plan_tools(tools: Any, tool_choice: Any) -> ToolPlan | None:
    """None when the request has no tools (tool_choice alone must then be absent or "none")."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise InvalidRequest("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise InvalidRequest("tools must be a non-empty list", param="tools")
    functions = [_function(t, i) for i, t in enumerate(tools)]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise InvalidRequest("tool names must be unique", param="tools")
    choice, forced = _choice(tool_choice, names)
    grammar = None
    if forced:
        chosen = [f for f in functions if choice == "required" or f["name"] == forced]
        grammar = GrammarSpec("tool_call", json.dumps(
            [{"name": f["name"], "parameters": json.loads(f["parameters"])} for f in chosen]))
    return ToolPlan(tools=tools, choice=choice, grammar=grammar)


def _function(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise InvalidRequest('each tool must be {"type": "function", "function": {...}}', param=f"tools[{i}].type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise InvalidRequest("the tool has no function object", param=f"tools[{i}].function")
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
        raise InvalidRequest("the function needs a name of 1-64 letters, digits, _ or -",
                             param=f"tools[{i}].function.name")
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    return {"name": name, "parameters": checked_schema(parameters, f"tools[{i}].function.parameters")}


def _choice(tool_choice: Any, names: list[str]) -> tuple[ToolChoice, str | None]:
    """(choice, the forced function's name or "required"'s marker) ."""
    if tool_choice is None or tool_choice == "auto":
        return "auto", None
    if tool_choice == "none":
        return "none", None
    if tool_choice == "required":
        return "required", "*"
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise InvalidRequest(f"tool_choice names a function that is not in tools: {name!r}",
                                 param="tool_choice.function.name")
        return "named", name
    raise InvalidRequest('tool_choice must be "none", "auto", "required" or {"type": "function", ...}',
                         param="tool_choice")


# -- prompts for templates without tool support ------------------------------------------------


def template_knows_tools(template: str | None) -> bool:
    return template is not None and "tools" in template and "tool_calls" in template


def tool_prompt_messages(messages: list[dict[str, Any]], plan: ToolPlan | None) -> list[dict[str, Any]]:
    """Messages a tool-unaware template renders: tools in the system message, calls and results as text."""
    out = [_as_text(m) for m in messages]
    if plan is None or plan.choice == "none":
        return out
    listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in plan.tools)
    system = (
        "You may call one or more functions to assist with the user query. The functions are listed "
        f"within <tools></tools>:\n<tools>\n{listing}\n</tools>\n\nFor each function call, return a JSON "
        f'object with the function name and arguments within {TOOL_CALL_START}{TOOL_CALL_END} tags:\n'
        f'{TOOL_CALL_START}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{TOOL_CALL_END}'
    )
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{system}"}, *out[1:]]
    return [{"role": "system", "content": system}, *out]


def _as_text(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content") or ""
    if message["role"] == "assistant" and message.get("tool_calls"):
        calls = [
            f'{TOOL_CALL_START}\n{{"name": {json.dumps(c["function"]["name"])}, '
            f'"arguments": {c["function"]["arguments"] or "{}"}}}\n{TOOL_CALL_END}'
            for c in message["tool_calls"]
        ]
        content = "\n".join([content, *calls]) if content else "\n".join(calls)
    if message["role"] == "tool":
        content = f"<tool_response>\n{content}\n</tool_response>"
    return {"role": message["role"], "content": content}
