"""A msgpack codec for frozen dataclasses: each message is the array [tag, *fields].

Each field's annotation (int, float, str, bool, Literal, X | None, a union of scalars, list/tuple of
those, nested dataclasses, SamplingParams) is compiled once into a checker and
an encoder. Checkers take only the value: the path of a bad value
("AddRequest.sampling.top_k") is assembled while a `_Bad` propagates, so valid
frames never pay for building paths. Decoding ignores extra trailing fields,
fills missing trailing fields that have defaults, and raises nothing but
`ProtocolError`. A message's last field may be a record spliced inline (`INLINE`).
The message types themselves live in shared/protocol.py.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

import msgpack

from shared.sampling import SamplingError, SamplingParams


class ProtocolError(ValueError):
    """A frame that is not a valid message; `request_id` is set when the frame named one."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


Check = Callable[[Any], Any]
"""Validates one decoded value and returns it (converted where needed); raises _Bad."""
Encode = Callable[[Any], Any] | None
"""Turns a field value into msgpack-able data; None: the value goes as it is."""


class _Bad(Exception):
    def __init__(self, message: str, path: str = "") -> None:
        self.message, self.path = message, path

    def at(self, segment: str) -> _Bad:
        self.path = segment + self.path
        return self


def _expected(what: str, value: Any) -> _Bad:
    return _Bad(f"expected {what}, got {type(value).__name__}")


def _check_int(value: Any) -> int:
    if type(value) is not int:
        raise _expected("int", value)
    return value


def _check_float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is not int:
        raise _expected("float", value)
    return float(value)


def _check_str(value: Any) -> str:
    if type(value) is not str:
        raise _expected("str", value)
    return value


def _check_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _expected("bool", value)
    return value


_SCALARS: dict[Any, Check] = {int: _check_int, float: _check_float, str: _check_str, bool: _check_bool}


def _list_checker(item: Check, item_type: Any, conv: type) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not list:
            raise _expected("array", value)
        if item_type in (int, str) and (not value or set(map(type, value)) == {item_type}):
            return value if conv is list else conv(value)  # the common case, checked at C speed
        out = []
        for x in value:
            try:
                out.append(item(x))
            except _Bad as e:
                raise e.at("[]") from None
        return conv(out)

    return check


def _scalar_union(options: list[Any], nullable: bool) -> Check:
    checks = [_SCALARS[o] for o in options]

    def check_union(v: Any) -> Any:
        if v is None and nullable:
            return None
        for check in checks:
            try:
                return check(v)
            except _Bad:
                pass
        raise _expected(" | ".join(o.__name__ for o in options), v)

    return check_union


def _compile(tp: Any) -> tuple[Check, Encode]:
    """Build the checker and encoder for one annotated type."""
    if tp in _SCALARS:
        return _SCALARS[tp], None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        allowed = tuple(str(a) for a in args)

        def check_literal(v: Any) -> Any:
            if type(v) is not str or v not in allowed:
                raise _expected(" | ".join(allowed), v)
            return v

        return check_literal, None
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) > 1:  # scalars only (SamplingParams.early_stopping: bool | str)
            return _scalar_union(options, len(options) < len(args)), None
        inner, enc = _compile(options[0])
        return (lambda v: None if v is None else inner(v)), (None if enc is None else
                                                              lambda v: None if v is None else enc(v))
    if origin is tuple and len(args) > 1 and args[1] is not Ellipsis:
        return _fixed_tuple_codec(args)
    if origin in (list, tuple):
        item, item_enc = _compile(args[0])
        list_enc: Encode = None if item_enc is None else (lambda v: [item_enc(x) for x in v])
        return _list_checker(item, args[0], tuple if origin is tuple else list), list_enc
    if tp is SamplingParams:
        return _check_sampling, SamplingParams.to_dict
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a nested record: an array of its fields, like a message
        fields = _fields_of(tp)
        return (lambda v: _decode_fields(tp, fields, v)), (lambda v: _encode_fields(fields, v))
    raise TypeError(f"wire codec: no codec for {tp!r}")  # a programming error, caught at import


def _fixed_tuple_codec(args: tuple[Any, ...]) -> tuple[Check, Encode]:
    """tuple[int, float]: an array of exactly those items (a logit_bias entry)."""
    parts = [_compile(a) for a in args]

    def check(value: Any) -> tuple[Any, ...]:
        if type(value) is not list or len(value) != len(parts):
            raise _expected(f"array of {len(parts)}", value)
        out = []
        for i, ((item, _), x) in enumerate(zip(parts, value, strict=True)):
            try:
                out.append(item(x))
            except _Bad as e:
                raise e.at(f"[{i}]") from None
        return tuple(out)

    return check, list


_SAMPLING_CHECKS: dict[str, Check] = {}


@dataclass(frozen=True)
class _Field:
    name: str
    check: Check
    encode: Encode
    required: bool


def _fields_of(cls: type) -> list[_Field]:
    hints = typing.get_type_hints(cls)
    return [
        _Field(f.name, *_compile(hints[f.name]),
               required=f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    ]


def _encode_fields(schema: list[_Field], msg: Any) -> list[Any]:
    return [getattr(msg, f.name) if f.encode is None else f.encode(getattr(msg, f.name)) for f in schema]


def _decode_fields(cls: type, schema: list[_Field], values: Any) -> Any:
    if type(values) is not list:
        raise _expected(f"{cls.__name__} array", values)
    return cls(**_decode_kwargs(schema, values))


def _decode_kwargs(schema: list[_Field], values: list[Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for f, value in zip(schema, values, strict=False):  # extra trailing values: a newer peer's fields
        try:
            kwargs[f.name] = f.check(value)
        except _Bad as e:
            raise e.at("." + f.name) from None
    for f in schema[len(values):]:
        if f.required:
            raise _Bad(f"missing field {f.name!r} ({len(values)} of {len(schema)} fields)")
    return kwargs


INLINE: Mapping[str, str] = {"wire": "inline"}
"""Field metadata for a message's last field: a record (a dataclass) whose fields are spliced into
the message's array after the message's own, so a message can carry a record that also lives on
its own (shared/model_info.py) with the bytes of a flat message. Appending to the record appends
to the message; the message itself can then get no fields of its own after it."""


@dataclass(frozen=True)
class _InlineTail:
    name: str
    cls: type
    schema: list[_Field]


def _message_schema(cls: type) -> tuple[list[_Field], _InlineTail | None]:
    """The message's own fields, and its inline record when its last field is one."""
    fields, schema = dataclasses.fields(cls), _fields_of(cls)
    inline = [i for i, f in enumerate(fields) if f.metadata.get("wire") == INLINE["wire"]]
    if not inline:
        return schema, None
    assert inline == [len(fields) - 1], f"{cls.__name__}: only the last field may be inline"
    record = typing.get_type_hints(cls)[fields[-1].name]
    assert isinstance(record, type) and dataclasses.is_dataclass(record), f"{cls.__name__}: inline needs a dataclass"
    return schema[:-1], _InlineTail(fields[-1].name, record, _fields_of(record))


def _decode_message(cls: type, schema: list[_Field], tail: _InlineTail | None, values: list[Any]) -> Any:
    if tail is None:
        return _decode_fields(cls, schema, values)
    own = _decode_kwargs(schema, values[:len(schema)])
    try:
        own[tail.name] = _decode_fields(tail.cls, tail.schema, values[len(schema):])
    except _Bad as e:
        raise e.at("." + tail.name) from None
    return cls(**own)


def _check_sampling(value: Any) -> SamplingParams:
    if type(value) is not dict:
        raise _expected("map", value)
    known = {}
    for key, raw in value.items():
        check = _SAMPLING_CHECKS.get(key)
        if check is not None:  # unknown keys come from newer peers: ignored
            try:
                known[key] = check(raw)
            except _Bad as e:
                raise e.at("." + key) from None
    try:
        return SamplingParams(**known)
    except SamplingError as e:
        raise _Bad(str(e), "." + e.param) from None


class Codec:
    """Encodes and decodes a fixed set of tagged message classes (each has a `TAG: ClassVar[int]`)."""

    def __init__(self, messages: tuple[type, ...]) -> None:
        self._by_tag: dict[int, tuple[type, list[_Field], _InlineTail | None]] = {}
        self._schema: dict[type, tuple[list[_Field], _InlineTail | None]] = {}
        for cls in messages:
            tag = cls.TAG  # type: ignore[attr-defined]
            assert tag not in self._by_tag, f"tag {tag} used twice"
            self._schema[cls] = _message_schema(cls)
            self._by_tag[tag] = (cls, *self._schema[cls])

    def encode(self, msg: Any) -> bytes:
        """One frame: msgpack array [tag, *fields] (an inline record's fields last)."""
        cls = type(msg)
        schema, tail = self._schema[cls]
        values = [cls.TAG, *_encode_fields(schema, msg)]
        if tail is not None:
            values += _encode_fields(tail.schema, getattr(msg, tail.name))
        return msgpack.packb(values, use_bin_type=True)  # type: ignore[no-any-return]

    def decode(self, frame: bytes) -> Any:
        """Parse one frame; raises ProtocolError (only) when it is not a valid message."""
        try:
            obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
        except Exception as e:  # msgpack raises a zoo of types on garbage; all mean the same here
            raise ProtocolError(f"not a msgpack frame ({type(e).__name__}: {e})") from None
        if type(obj) is not list or not obj:
            raise ProtocolError(f"expected a non-empty array [tag, ...], got {type(obj).__name__}")
        tag = obj[0]
        found = self._by_tag.get(tag) if type(tag) is int else None
        if found is None:
            raise ProtocolError(f"unknown message tag {tag!r}")
        cls, schema, tail = found
        try:
            return _decode_message(cls, schema, tail, obj[1:])
        except _Bad as e:
            # Name the request of a broken message that starts with a request id, so it can be answered.
            rid = obj[1] if schema[0].name == "request_id" and len(obj) > 1 and type(obj[1]) is str else None
            raise ProtocolError(f"{cls.__name__}{e.path}: {e.message}", request_id=rid) from None
        except (TypeError, ValueError) as e:  # a nested constructor refused a value
            raise ProtocolError(f"{cls.__name__}: {e}") from None


_SAMPLING_CHECKS.update({f.name: f.check for f in _fields_of(SamplingParams)})
