"""Structured-output fields of a request body -> one GrammarSpec for the engine, or a 400 naming the field.

Accepted (at most one of them per request):

    response_format   {"type": "text"} | {"type": "json_object"}
                      | {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
    structured_outputs  vLLM's: {"json": schema | "json_object": true | "regex": str | "choice": [str]
                        | "grammar": str}
    guided_json, guided_regex, guided_choice, guided_grammar   vLLM's older spelling of the same

A JSON schema is checked against its meta-schema here (jsonschema), so a broken schema is a 400
naming the problem before anything reaches the engine; the engine's compile check (xgrammar)
catches what is valid JSON Schema but beyond the grammar engine. Knows nothing about HTTP or
the engine; never imports torch.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from gateway.errors import InvalidRequest
from shared.structured import GrammarSpec

STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")
MAX_CHOICES = 256


def grammar_from_body(fields: dict[str, Any]) -> GrammarSpec | None:
    """`fields`: the STRUCTURED_FIELDS present in the body (None values dropped)."""
    given = {k: v for k, v in fields.items() if v is not None}
    specs = [(name, spec) for name, value in given.items() if (spec := _one_field(name, value)) is not None]
    if len(specs) > 1:
        names = ", ".join(name for name, _ in specs)
        raise InvalidRequest(f"only one structured-output field may be given, got {names}", param=specs[1][0])
    return specs[0][1] if specs else None


def _one_field(name: str, value: Any) -> GrammarSpec | None:
    if name == "response_format":
        return _response_format(value)
    if name == "structured_outputs":
        return _structured_outputs(value)
    kind = name.removeprefix("guided_")
    return _guided(kind, value, name)


def _response_format(value: Any) -> GrammarSpec | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequest("response_format must be an object with a type", param="response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind != "json_schema":
        raise InvalidRequest(f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                             param="response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest("response_format.json_schema must be an object with a schema",
                             param="response_format.json_schema")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name)):
        raise InvalidRequest("response_format.json_schema.name must be 1-64 letters, digits, _ or -",
                             param="response_format.json_schema.name")
    if "strict" in spec and not isinstance(spec["strict"], bool | None):
        raise InvalidRequest("response_format.json_schema.strict must be a boolean",
                             param="response_format.json_schema.strict")
    schema = spec.get("schema", {"type": "object"})
    return GrammarSpec("json_schema", checked_schema(schema, "response_format.json_schema.schema"))


def _structured_outputs(value: Any) -> GrammarSpec | None:
    if not isinstance(value, dict):
        raise InvalidRequest("structured_outputs must be an object", param="structured_outputs")
    known = {k: v for k, v in value.items() if v is not None and v is not False}
    unknown = set(known) - {"json", "json_object", "regex", "choice", "grammar"}
    if unknown:
        raise InvalidRequest(f"structured_outputs has unknown fields: {', '.join(sorted(unknown))}",
                             param="structured_outputs")
    if len(known) != 1:
        raise InvalidRequest("structured_outputs must set exactly one of json, json_object, regex, choice, grammar",
                             param="structured_outputs")
    kind, spec = next(iter(known.items()))
    if kind == "json_object":
        return GrammarSpec("json_object")
    return _guided(kind, spec, f"structured_outputs.{kind}")


def _guided(kind: str, value: Any, param: str) -> GrammarSpec:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise InvalidRequest(f"{param} is not valid JSON: {e}", param=param) from None
        return GrammarSpec("json_schema", checked_schema(value, param))
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise InvalidRequest(f"{param} must be a non-empty string", param=param)
        try:
            re.compile(value)
        except re.error as e:
            raise InvalidRequest(f"{param} is not a valid regular expression: {e}", param=param) from None
        return GrammarSpec("regex", value)
    if kind == "choice":
        if (not isinstance(value, list) or not 1 <= len(value) <= MAX_CHOICES
                or not all(isinstance(c, str) and c for c in value)):
            raise InvalidRequest(f"{param} must be a list of 1 to {MAX_CHOICES} non-empty strings", param=param)
        return GrammarSpec("choice", json.dumps(value))
    if kind == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest(f"{param} must be a non-empty EBNF grammar", param=param)
        return GrammarSpec("grammar", value)
    raise InvalidRequest(f"unsupported parameter: {param}", param=param, code="unsupported_parameter")


def checked_schema(schema: Any, param: str) -> str:
    """The schema as compact JSON text (equal schemas share one compiled grammar), or a 400
    saying where it breaks the JSON Schema meta-schema."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON Schema object", param=param)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise InvalidRequest(f"{param} is not a valid JSON Schema{f' at /{where}' if where else ''}: {e.message}",
                             param=param, code="invalid_schema") from None
    return json.dumps(schema, separators=(",", ":"))  # key order kept: it is the order properties are written
