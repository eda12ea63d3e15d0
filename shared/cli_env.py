"""Every command-line flag with a PAGESERVE_* environment twin, and the table that lists them.

    parser = argparse.ArgumentParser(...)          # flags as usual, with help and defaults
    add_env_twins(parser, "PAGESERVE_ENGINE_", {"model": "PAGESERVE_MODEL"})
    args = parser.parse_args(argv)                 # flag > environment > default

`add_env_twins` gives each optional flag an environment variable (prefix + the
flag's name in capitals, or an explicit name), reads it once through the flag's
own type and choices (a bad value stops start-up naming the variable and the
flag), and writes both into `--help`. `settings_table` renders the same facts as
the README's Markdown table (tests/shared/test_cli_env.py keeps the README in
step). Range checks belong to the frozen config objects built from the result.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
ENV_ATTR = "pageserve_env"
"""Where the variable's name is kept on the argparse action (for the table)."""


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def env_name(action: argparse.Action, prefix: str, names: Mapping[str, str]) -> str:
    return names.get(action.dest) or prefix + action.dest.upper()


def _from_env(parser: argparse.ArgumentParser, action: argparse.Action, var: str, text: str) -> object:
    flag = action.option_strings[-1]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        word = text.strip().lower()
        if word not in TRUE_WORDS | FALSE_WORDS:
            parser.error(f"{var}={text!r} (the twin of {flag}) must be one of 1/0, true/false, yes/no, on/off")
        on = word in TRUE_WORDS
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    try:
        value = action.type(text) if callable(action.type) else text
    except (TypeError, ValueError):
        type_name = getattr(action.type, "__name__", "value")
        parser.error(f"{var}={text!r} (the twin of {flag}) is not a valid {type_name}")
    if action.choices is not None and value not in action.choices:
        parser.error(f"{var}={text!r} (the twin of {flag}) must be one of {', '.join(map(str, action.choices))}")
    return value


def add_env_twins(parser: argparse.ArgumentParser, prefix: str, names: Mapping[str, str] | None = None,
                  environ: Mapping[str, str] | None = None) -> None:
    """Read each flag's twin from `environ` (os.environ) into its default; document both in --help."""
    env = os.environ if environ is None else environ
    names = names or {}
    for action in _options(parser):
        var = env_name(action, prefix, names)
        setattr(action, ENV_ATTR, var)
        shown = action.default
        if var in env:
            action.default = _from_env(parser, action, var, env[var])
        action.help = f"{action.help or ''} [env {var}; default {_show_default(shown)}]".strip()


def _show_default(value: object) -> str:
    if value is None or value == "":
        return "none"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def settings_table(parser: argparse.ArgumentParser) -> str:
    """A Markdown table of every flag: flag, environment twin, default, meaning."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for action in _options(parser):
        help_text = (action.help or "").split("[env ")[0].strip().replace("|", "\\|")
        default = _documented_default(action)
        rows.append(f"| `{action.option_strings[-1]}` | `{getattr(action, ENV_ATTR, '')}` | {default} | {help_text} |")
    return "\n".join(rows)


def _documented_default(action: argparse.Action) -> str:
    text = action.help or ""
    marker = "; default "
    if marker in text:
        return "`" + text.rsplit(marker, 1)[1].rstrip("]") + "`"
    return "`" + _show_default(action.default) + "`"
