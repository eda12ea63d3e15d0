"""The model's tool calls, parsed out of its text as it streams: content deltas, call starts, argument deltas.

Families parsed: the Hermes format, one call per tag pair

    <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>

(Qwen2.5, Hermes 2/3, SmolLM3, and what the grammar writes for forced calls), and SmolLM2's
variant with a JSON array of calls inside one tag pair. While a call streams in Hermes key order
(name, then arguments), its arguments go out as they are written: the concatenation of the
argument deltas is the arguments' JSON text. Any other shape is parsed once its closing tag (or
the end of the output) arrives, and goes out as one delta. Text that is not a call is content;
an unparsable call is returned as content, as the model wrote it.

Knows nothing about HTTP, OpenAI's chunk shapes or the engine.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from shared.structured import TOOL_CALL_END, TOOL_CALL_START

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    text: str


Event = str | ToolCallStart | ArgumentsDelta
"""A str is content."""


@dataclass
class _Streaming:
    index: int
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    done: bool = False


@dataclass
class ToolCallParser:
    num_calls: int = 0
    _buffer: str = ""
    _inside: bool = False
    _body: str = ""
    _consumed: int = 0
    """Characters of _body already handed out as arguments or header."""
    _call: _Streaming | None = None
    _pieces: list[Event] = field(default_factory=list)

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        out: list[Event] = []
        while self._buffer:
            if not self._inside:
                start = self._buffer.find(TOOL_CALL_START)
                if start < 0:
                    keep = _partial_tag_suffix(self._buffer, TOOL_CALL_START)
                    _content(out, self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return out
                _content(out, self._buffer[:start])
                self._buffer = self._buffer[start + len(TOOL_CALL_START):]
                self._inside, self._body, self._consumed, self._call = True, "", 0, None
                continue
            end = self._buffer.find(TOOL_CALL_END)
            if end < 0:
                keep = _partial_tag_suffix(self._buffer, TOOL_CALL_END)
                self._body += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep:]
                out += self._stream_body()
                return out
            self._body += self._buffer[:end]
            self._buffer = self._buffer[end + len(TOOL_CALL_END):]
            out += self._stream_body()
            out += self._close_call(TOOL_CALL_END)
        return out

    def finish(self) -> list[Event]:
        """The output ended: an unclosed call is closed, held-back text is content."""
        out: list[Event] = []
        if self._inside:
            self._body += self._buffer
            self._buffer = ""
            out += self._stream_body()
            out += self._close_call("")
        _content(out, self._buffer)
        self._buffer = ""
        return out

    # -- inside one <tool_call> ----------------------------------------------------------

    def _stream_body(self) -> list[Event]:
        out: list[Event] = []
        if self._call is None:
            head = _HEAD.match(self._body)
            if head is None or not self._body[head.end():]:
                return out
            name = json.loads(f'"{head.group(1)}"')
            self._call = _Streaming(self._new_index())
            out.append(ToolCallStart(self._call.index, _call_id(), name))
            self._consumed = head.end()
        call = self._call
        if call.done:
            return out
        piece = []
        for ch in self._body[self._consumed:]:
            self._consumed += 1
            if _step(call, ch):
                call.done = True
                break
            piece.append(ch)
        if piece:
            out.append(ArgumentsDelta(call.index, "".join(piece)))
        return out

    def _close_call(self, end_tag: str) -> list[Event]:
        """The call's body is complete (`end_tag`: how it ended, given back if it is no call)."""
        body, streamed = self._body, self._call
        self._inside, self._body, self._call = False, "", None
        if streamed is not None:  # its header and arguments went out while it streamed
            return []
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError:
            return [f"{TOOL_CALL_START}{body}{end_tag}"]
        calls = parsed if isinstance(parsed, list) else [parsed]
        if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
            return [f"{TOOL_CALL_START}{body}{end_tag}"]
        out: list[Event] = []
        for c in calls:
            index = self._new_index()
            out.append(ToolCallStart(index, _call_id(), c["name"]))
            args = c.get("arguments", c.get("parameters", {}))
            out.append(ArgumentsDelta(index, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        return out

    def _new_index(self) -> int:
        self.num_calls += 1
        return self.num_calls - 1


def _step(call: _Streaming, ch: str) -> bool:
    """Advance the arguments scanner by one character; True when `ch` closes the call object
    (the character after the arguments value, which is not part of it)."""
    if call.in_string:
        if call.escaped:
            call.escaped = False
        elif ch == "\\":
            call.escaped = True
        elif ch == '"':
            call.in_string = False
        return False
    if ch == '"':
        call.in_string = True
    elif ch in "{[":
        call.depth += 1
    elif ch in "}]":
        if call.depth == 0:
            return True
        call.depth -= 1
    elif ch == "," and call.depth == 0:
        return True  # a key after "arguments": the value ended
    return False


def _content(out: list[Event], text: str) -> None:
    if text:
        out.append(text)


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
