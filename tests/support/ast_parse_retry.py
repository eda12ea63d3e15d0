"""CPython before 3.11.8 sometimes fails `ast.parse` with "AST constructor recursion depth mismatch"
(gh-106905: the converter's depth counter is module-global and goes wrong when another parse runs inside
one, from a thread switch or a finalizer). Hypothesis parses lambdas' source to describe strategies, so a
fuzz run failed on it once in CI (a FlakyFailure: the same case passed on replay). The counter is reset at
the start of every parse, so parsing again, with the collector off so that no finalizer can run in the
middle, is the fix; any other SystemError is raised as before."""

from __future__ import annotations

import ast
import gc
import sys
from collections.abc import Callable
from typing import Any

MISMATCH = "AST constructor recursion depth mismatch"


def retrying(parse: Callable[..., Any]) -> Callable[..., Any]:
    def parse_again_on_mismatch(*args: Any, **kwargs: Any) -> Any:
        try:
            return parse(*args, **kwargs)
        except SystemError as error:
            if MISMATCH not in str(error):
                raise
        collecting = gc.isenabled()
        gc.disable()
        try:
            return parse(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()

    parse_again_on_mismatch.__wrapped__ = parse  # type: ignore[attr-defined]
    return parse_again_on_mismatch


def install() -> None:
    """Wrap `ast.parse` on the interpreters that have the bug (module attribute: hypothesis and
    traceback call it as `ast.parse`)."""
    if sys.version_info[:2] == (3, 11) and sys.version_info < (3, 11, 8) and not hasattr(ast.parse, "__wrapped__"):
        ast.parse = retrying(ast.parse)
