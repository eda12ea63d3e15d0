"""`python -m ops.settings_table`: docs/operations.md's tables of every engine and gateway setting.

Generated from the commands' own parsers (flags, PAGESERVE_* twins, defaults,
help), so the docs cannot drift from `--help`: tests/ops/test_settings_table.py
fails when the copy in docs/operations.md differs, and `--write` refreshes it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from shared.cli_env import settings_table

SETTINGS_DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
"""The page holding the generated tables (the README held them until docs/ was organised by reader)."""


def tables() -> dict[str, str]:
    from engine.serving.main import build_parser as engine_parser
    from gateway.server import build_parser as gateway_parser

    # An empty environment: the table shows defaults, whatever this shell has set.
    return {"engine": settings_table(engine_parser({})), "gateway": settings_table(gateway_parser({}))}


def block(name: str, table: str) -> str:
    return f"<!-- settings:{name} (generated: python -m ops.settings_table --write) -->\n{table}\n<!-- /settings:{name} -->"


def readme_with_tables(text: str) -> str:
    for name, table in tables().items():
        pattern = re.compile(rf"<!-- settings:{name} .*?<!-- /settings:{name} -->", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{SETTINGS_DOC.name} has no settings:{name} block")
        replacement = block(name, table)
        text = pattern.sub(lambda _, r=replacement: r, text)
    return text


def main(argv: list[str]) -> int:
    if "--write" in argv:
        SETTINGS_DOC.write_text(readme_with_tables(SETTINGS_DOC.read_text()))
        return 0
    for name, table in tables().items():
        print(f"## {name}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
