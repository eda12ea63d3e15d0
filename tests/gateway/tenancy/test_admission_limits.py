"""Each limit admits exactly its allowance under a concurrent burst, and refusals say why."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.tenancy import QuotaExceeded, TenantStore
from gateway.tenancy.admission import Admission, Ticket, format_duration
from gateway.tenancy.quota_store import QuotaStore
from tests.gateway.tenancy.conftest import make_tenant

pytestmark = pytest.mark.anyio

BURST = 200


async def burst(admission: Admission, auth, prompt: int, output: int, n: int = BURST):
    start = time.monotonic()
    results = await asyncio.gather(*(admission.admit(auth, prompt, output) for _ in range(n)),
                                   return_exceptions=True)
    elapsed = time.monotonic() - start
    unexpected = [r for r in results if not isinstance(r, Ticket | QuotaExceeded)]
    assert not unexpected, [getattr(r, "detail", r) for r in unexpected[:3]]
    admitted = [r for r in results if isinstance(r, Ticket)]
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    return admitted, refused, elapsed


# (limit field, value, prompt, output, refusal type, refusal code): each case allows exactly 50.
CASES = [
    ("rpm", 50, 1, 1, "requests", "rate_limit_exceeded"),
    ("input_tpm", 500, 10, 1, "tokens", "rate_limit_exceeded"),
    ("output_tpm", 1000, 1, 20, "tokens", "rate_limit_exceeded"),
    ("concurrency", 50, 1, 1, "requests", "rate_limit_exceeded"),
    ("daily_tokens", 1500, 10, 20, "tokens", "insufficient_quota"),
    ("monthly_tokens", 1500, 10, 20, "tokens", "insufficient_quota"),
]


def allowance(field: str, elapsed: float) -> int:
    """The most a burst may get: 50, plus what a per-minute bucket refilled while it ran (none under 1.2 s).

    Elapsed is measured around the whole burst, so it over-states the refill window: the
    tests assert 50 <= admitted <= allowance, which is exactly 50 for any burst under 1.2 s."""
    return 50 + (int(elapsed * 50 / 60) if field in ("rpm", "input_tpm", "output_tpm") else 0)


@pytest.mark.parametrize(("field", "limit", "prompt", "output", "kind", "code"), CASES, ids=[c[0] for c in CASES])
async def test_a_burst_of_200_admits_exactly_the_tenant_allowance(store, admission, field, limit, prompt,
                                                                  output, kind, code):
    _, auth = await make_tenant(store, **{field: limit})
    admitted, refused, elapsed = await burst(admission, auth, prompt, output)
    assert 50 <= len(admitted) <= allowance(field, elapsed)  # exactly 50 unless the burst took over 1.2 s
    assert {(r.limit_type, r.code) for r in refused} == {(kind, code)}
    assert all(r.fits and r.retry_after_ms > 0 for r in refused)


@pytest.mark.parametrize(("field", "limit", "prompt", "output", "kind", "code"), CASES, ids=[c[0] for c in CASES])
async def test_a_key_limit_binds_one_key_not_its_siblings(store, admission, field, limit, prompt, output, kind,
                                                          code):
    _, auth = await make_tenant(store)
    sibling = await store.authenticate((await store.create_key("acme"))[0])
    await QuotaStore(store).set("acme", auth.key_id, {field: limit})
    admitted, refused, elapsed = await burst(admission, auth, prompt, output)
    assert 50 <= len(admitted) <= allowance(field, elapsed)
    assert f"key {auth.key_id}" in refused[0].message
    others, refused_others, _ = await burst(admission, sibling, prompt, output, n=60)
    assert len(others) == 60 and not refused_others


async def test_tier_defaults_apply_until_overridden(store: TenantStore, admission: Admission):
    await store.create_tenant("small", tier="free")  # free tier: 4 concurrent requests
    auth = await store.authenticate((await store.create_key("small"))[0])
    admitted, refused, _ = await burst(admission, auth, 1, 1, n=10)
    assert len(admitted) == 4 and "concurrent" in refused[0].message
    await QuotaStore(store).set("small", None, {"concurrency": 6})
    more, _, _ = await burst(admission, auth, 1, 1, n=10)
    assert len(more) == 2


async def test_nothing_is_charged_when_refused(store, admission, client, prefix):
    _, auth = await make_tenant(store, rpm=1, daily_tokens=100)
    ticket = await admission.admit(auth, 10, 20)
    with pytest.raises(QuotaExceeded):
        await admission.admit(auth, 10, 20)
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    assert await client.get(f"{prefix}:budget:tenant:acme:d:{day}") == "30"
    assert len(await client.keys(f"{prefix}:resv:*")) == 1
    await ticket.settle(10, 20)


async def test_headers_on_admission_and_on_refusal(store: TenantStore, admission: Admission):
    _, auth = await make_tenant(store, rpm=10, input_tpm=1000, output_tpm=400)
    ticket = await admission.admit(auth, 100, 100)
    h = ticket.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("10", "9")
    assert h["x-ratelimit-reset-requests"] == "6s"  # one request back at 10 per minute
    # the tightest token bucket is reported: output at 300/400 is tighter than input at 900/1000
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("400", "300")
    assert h["x-ratelimit-reset-tokens"] == "15s"
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 1, 350)
    exc = info.value
    assert exc.limit_type == "tokens" and exc.code == "rate_limit_exceeded"
    assert 7400 <= exc.retry_after_ms <= 7500  # 50 more output tokens at 400/min
    assert exc.headers["retry-after"] == "8" and exc.headers["retry-after-ms"] == str(exc.retry_after_ms)
    assert exc.headers["x-ratelimit-remaining-tokens"] == "300"
    assert exc.body() == {"error": {"message": exc.message, "type": "tokens", "param": None,
                                    "code": "rate_limit_exceeded"}}
    assert "output tokens per minute" in exc.message and "tenant acme" in exc.message
    await ticket.settle(100, 100)


async def test_unlimited_tenants_get_no_ratelimit_headers(store: TenantStore, admission: Admission):
    _, auth = await make_tenant(store)
    ticket = await admission.admit(auth, 5, 5)
    assert ticket.headers == {}
    await ticket.settle(5, 5)


async def test_a_request_larger_than_a_limit_is_refused_as_never_admissible(store, admission):
    _, auth = await make_tenant(store, input_tpm=1000, daily_tokens=5000)
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 1001, 10)
    assert not info.value.fits and "never be admitted" in info.value.message
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 500, 4600)
    assert not info.value.fits and info.value.code == "insufficient_quota"


async def test_budget_refusal_retries_after_the_utc_day_ends(store, admission):
    _, auth = await make_tenant(store, daily_tokens=100)
    ticket = await admission.admit(auth, 50, 50)
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 1, 1)
    now = dt.datetime.now(dt.UTC)
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    assert abs(info.value.retry_after_ms / 1000 - (midnight - now).total_seconds()) < 5
    assert info.value.code == "insufficient_quota" and "daily token budget" in info.value.message
    await ticket.settle(50, 0)  # 50 tokens refunded to the budget
    assert isinstance(await admission.admit(auth, 25, 25), Ticket)  # fits again


async def test_zero_limit_refuses_everything(store, admission):
    _, auth = await make_tenant(store, concurrency=0)
    with pytest.raises(QuotaExceeded) as info:
        await admission.admit(auth, 1, 1)
    assert not info.value.fits


@pytest.mark.parametrize(("ms", "text"), [(0, "0ms"), (250, "250ms"), (1000, "1s"), (1500, "1.5s"),
                                          (59_999, "59.999s"), (360_000, "6m0s"), (7_380_000, "2h3m0s")])
def test_reset_durations_use_openai_format(ms, text):
    assert format_duration(ms) == text


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(0, 4), key_limit=st.none() | st.integers(0, 4),
       ops=st.lists(st.sampled_from(["admit", "admit_sibling", "settle_oldest", "settle_newest"]), max_size=25))
async def test_concurrency_matches_a_model_of_held_slots(store, admission, limit, key_limit, ops):
    """Property: a request is admitted iff the tenant (and its key, if limited) holds fewer slots than allowed."""
    name = f"c{len(await store.list_tenants())}"
    _, auth = await make_tenant(store, name=name, concurrency=limit)
    sibling = await store.authenticate((await store.create_key(name))[0])
    if key_limit is not None:
        await QuotaStore(store).set(name, auth.key_id, {"concurrency": key_limit})
    held: list[tuple[Ticket, bool]] = []  # (ticket, is it the limited key's)
    for op in ops:
        if op.startswith("admit"):
            mine = op == "admit"
            tenant_room = len(held) < limit
            key_room = not mine or key_limit is None or sum(m for _, m in held) < key_limit
            try:
                ticket = await admission.admit(auth if mine else sibling, 1, 1)
                assert tenant_room and key_room
                held.append((ticket, mine))
            except QuotaExceeded as exc:
                assert not (tenant_room and key_room)
                assert "concurrent" in exc.message
        elif held:
            ticket, _ = held.pop(0 if op == "settle_oldest" else -1)
            assert (await ticket.settle(1, 1)).status == "settled"
    for ticket, _ in held:
        await ticket.settle(1, 0)
