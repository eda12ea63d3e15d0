"""Reservation and settlement: charged = what the client was sent, refunds <= reservation, exactly once."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.tenancy import QuotaExceeded
from gateway.tenancy.admission import Admission, Ticket
from gateway.tenancy.usage import UsageReader
from tests.gateway.tenancy.conftest import make_tenant

pytestmark = pytest.mark.anyio


def today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


async def usage(client, prefix, scope="tenant", ident="acme"):
    rows = await UsageReader(client, prefix).read(scope, [ident], today(), today())
    return rows[0] if rows else None


async def budget(client, prefix, scope="tenant:acme") -> int:
    return int(await client.get(f"{prefix}:budget:{scope}:d:{today():%Y%m%d}") or 0)


# How a request ends, as the gateway reports it: (prompt, completion sent, cached, error).
ENDINGS = {
    "completed_at_max_tokens": (12, 40, 0, False),
    "stopped_early_by_eos_or_stop_string": (12, 7, 4, False),
    "aborted_by_the_engine": (12, 3, 0, True),
    "client_disconnected_mid_stream": (12, 11, 0, False),
    "failed_before_any_token": (12, 0, 0, True),
}


async def test_usage_equals_what_each_request_was_sent(store, admission, client, prefix):
    _, auth = await make_tenant(store)
    tickets = [await admission.admit(auth, 12, 40) for _ in ENDINGS]
    results = [await t.settle(*ending) for t, ending in zip(tickets, ENDINGS.values(), strict=True)]
    assert [r.status for r in results] == ["settled"] * len(ENDINGS)
    for r, (p, c, _, _) in zip(results, ENDINGS.values(), strict=True):
        assert r.charged_tokens == p + c and r.refunded_tokens == 40 - c
    expected = dict(requests=5, prompt_tokens=60, cached_tokens=4, errors=2,
                    completion_tokens=sum(c for _, c, _, _ in ENDINGS.values()))
    for scope, ident in (("tenant", "acme"), ("key", auth.key_id)):
        row = await usage(client, prefix, scope, ident)
        assert {k: getattr(row, k) for k in expected} == expected
    assert await budget(client, prefix) == 60 + expected["completion_tokens"]


async def test_settling_twice_or_concurrently_changes_nothing(store, admission, client, prefix):
    _, auth = await make_tenant(store, concurrency=1)
    ticket = await admission.admit(auth, 10, 50)
    results = await asyncio.gather(*(ticket.settle(10, 20) for _ in range(10)))
    assert sorted(r.status for r in results) == ["already"] * 9 + ["settled"]
    again = await admission.settle_reservation(ticket.reservation_id, 10, 0)
    assert again.status == "already"
    row = await usage(client, prefix)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 10, 20)
    assert await budget(client, prefix) == 30
    assert (await admission.settle_reservation("no-such-reservation", 1, 1)).status == "unknown"


async def test_output_refund_frees_per_minute_capacity_and_settle_releases_the_slot(store, admission):
    _, auth = await make_tenant(store, output_tpm=100, concurrency=1)
    ticket = await admission.admit(auth, 5, 100)
    with pytest.raises(QuotaExceeded, match="concurrent"):
        await admission.admit(auth, 5, 1)
    result = await ticket.settle(5, 30)
    assert result.refunded_tokens == 70
    second = await admission.admit(auth, 5, 70)  # the 70 unused tokens are back (plus a little refill)
    await second.settle(5, 70)
    with pytest.raises(QuotaExceeded, match="output tokens per minute"):
        await admission.admit(auth, 5, 60)


async def test_a_client_sent_more_than_reserved_is_charged_in_full_with_no_refund(store, admission, client,
                                                                                   prefix):
    _, auth = await make_tenant(store)
    ticket = await admission.admit(auth, 10, 5)
    result = await ticket.settle(10, 9)
    assert (result.charged_tokens, result.refunded_tokens) == (19, 0)
    assert await budget(client, prefix) == 19
    assert (await usage(client, prefix)).completion_tokens == 9


async def test_cached_tokens_are_counted_within_the_prompt(store, admission, client, prefix):
    _, auth = await make_tenant(store)
    await (await admission.admit(auth, 10, 5)).settle(10, 5, cached_tokens=99)
    assert (await usage(client, prefix)).cached_tokens == 10


async def test_negative_counts_are_refused(store, admission):
    _, auth = await make_tenant(store)
    from gateway.tenancy import InvalidArgument

    with pytest.raises(InvalidArgument):
        await admission.admit(auth, -1, 5)
    ticket = await admission.admit(auth, 1, 5)
    with pytest.raises(InvalidArgument):
        await ticket.settle(1, -2)
    await ticket.settle(1, 2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300), st.integers(0, 400),
                                   st.booleans(), st.integers(1, 3)), min_size=1, max_size=12))
async def test_budget_always_equals_outstanding_reservations_plus_settled_usage(store, admission: Admission,
                                                                                 client, prefix, requests):
    """Property: charged budget = sum(reserved, unsettled) + sum(actual, settled); refunds <= reserved."""
    tenant = f"p{len(await store.list_tenants())}"
    _, auth = await make_tenant(store, name=tenant)
    outstanding, settled_total = 0, 0
    for prompt, max_tokens, completion, settle_it, times in requests:
        ticket: Ticket = await admission.admit(auth, prompt, max_tokens)
        if settle_it:
            for i in range(times):
                result = await ticket.settle(prompt, completion)
                assert result.status == ("settled" if i == 0 else "already")
                if i == 0:
                    assert 0 <= result.refunded_tokens <= max_tokens
                    assert result.refunded_tokens == max(0, max_tokens - completion)
            settled_total += prompt + completion
        else:
            outstanding += prompt + max_tokens
        assert await budget(client, prefix, f"tenant:{tenant}") == outstanding + settled_total
