from __future__ import annotations

import ast

import pytest

from tests.support.ast_parse_retry import MISMATCH, retrying


def test_a_depth_mismatch_is_parsed_again_and_other_errors_are_raised() -> None:
    calls: list[str] = []

    def flaky(source: str) -> ast.Module:
        calls.append(source)
        if len(calls) == 1:
            raise SystemError(f"{MISMATCH} (before=267, after=287)")
        return ast.parse(source)

    assert isinstance(retrying(flaky)("x = 1"), ast.Module) and calls == ["x = 1", "x = 1"]

    def broken(source: str) -> ast.Module:
        raise SystemError("something else")

    with pytest.raises(SystemError, match="something else"):
        retrying(broken)("x = 1")
