"""`python -m ops.ready_probe`: wait until the gateway's /ready answers 200 (the unit's ExecStartPost).

Reads the gateway's own settings from the environment the unit gives it
(PAGESERVE_HOST, PAGESERVE_PORT, PAGESERVE_TLS_CERTFILE), so it probes exactly
the listener the gateway opened; a wildcard host is probed on loopback. Exit 0
once ready, 1 after --timeout seconds (systemd then stops the unit and its
Restart= policy applies). The body of the last 503 is printed: it says what is
wrong (engine not connected, Redis unreachable ...).
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import time
import urllib.error
import urllib.request


def ready_url(env: dict[str, str]) -> str:
    host = env.get("PAGESERVE_HOST", "127.0.0.1")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if env.get("PAGESERVE_TLS_CERTFILE") else "http"
    return f"{scheme}://{host}:{env.get('PAGESERVE_PORT', '8000')}/ready"


def wait_ready(url: str, timeout_s: float, interval_s: float = 0.5) -> tuple[bool, str]:
    # Loopback probe of our own listener: the certificate is for the public name, not checked here.
    context = ssl._create_unverified_context() if url.startswith("https") else None
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as r:
                return True, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            last = f"{e.code}: {e.read().decode(errors='replace')}"
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(interval_s)
    return False, last


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.ready_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait")
    p.add_argument("--url", default=None, help="default: from PAGESERVE_HOST / PAGESERVE_PORT / TLS settings")
    a = p.parse_args(argv)
    url = a.url or ready_url(dict(os.environ))
    ok, detail = wait_ready(url, a.timeout)
    verdict = "ready" if ok else f"not ready after {a.timeout:g} s"
    print(f"{url}: {verdict} ({detail.strip()[:500]})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
