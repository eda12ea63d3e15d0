"""A separate OS process running the admission path, for the multi-process tests.

    python -m tests.gateway.tenancy.worker burst URL PREFIX KEY N   # wait for "go", admit N at once, print counts
    python -m tests.gateway.tenancy.worker hold URL PREFIX KEY LEASE_S HEARTBEAT_S   # admit one, keep it alive
"""

from __future__ import annotations

import asyncio
import json
import sys

from gateway.tenancy import QuotaExceeded, TenantStore, connect
from gateway.tenancy.admission import Admission, AdmissionConfig, Ticket


async def burst(url: str, prefix: str, key: str, n: int) -> None:
    client = connect(url)
    auth = await TenantStore(client, prefix).authenticate(key)
    assert auth is not None
    admission = Admission(client, prefix)
    await client.rpush(f"{prefix}:ready", 1)
    await client.blpop([f"{prefix}:go"], timeout=30)
    results = await asyncio.gather(*(admission.admit(auth, 1, 1) for _ in range(n)), return_exceptions=True)
    counts = {"admitted": sum(isinstance(r, Ticket) for r in results),
              "refused": sum(isinstance(r, QuotaExceeded) for r in results),
              "other": [repr(r) for r in results if not isinstance(r, Ticket | QuotaExceeded)][:3]}
    print(json.dumps(counts), flush=True)
    await admission.aclose()  # tickets stay unsettled on purpose: concurrency slots stay held
    await client.aclose()


async def hold(url: str, prefix: str, key: str, lease_s: float, heartbeat_s: float) -> None:
    client = connect(url)
    auth = await TenantStore(client, prefix).authenticate(key)
    assert auth is not None
    admission = Admission(client, prefix, AdmissionConfig(lease_s=lease_s, heartbeat_s=heartbeat_s))
    ticket = await admission.admit(auth, 1, 1)
    print(f"admitted {ticket.reservation_id}", flush=True)
    await asyncio.sleep(3600)  # a stream that never ends, until the test kills this process


def main(argv: list[str]) -> None:
    mode, url, prefix, key, *rest = argv
    if mode == "burst":
        asyncio.run(burst(url, prefix, key, int(rest[0])))
    else:
        asyncio.run(hold(url, prefix, key, float(rest[0]), float(rest[1])))


if __name__ == "__main__":
    main(sys.argv[1:])
