"""The gateway process never pays for torch or transformers (start-up in ~1 s, STYLE.md item 14)."""

from __future__ import annotations

import subprocess
import sys


def test_gateway_modules_import_without_torch() -> None:
    code = (
        "import sys, gateway.app, gateway.server, gateway.state, gateway.engine_link, gateway.tokenizer; "
        "heavy = sorted(m for m in ('torch', 'transformers', 'engine') if m in sys.modules); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
