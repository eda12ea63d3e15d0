"""Admission: one atomic quota check per request, and its settlement exactly once.

Gateway use, one admission point and one settlement `finally` per request:

    admission = Admission(redis, prefix="ps")                 # in the lifespan
    admitted = await admission.admit_key(bearer_key, prompt_tokens, n * max_tokens)
        # None -> 401; raises QuotaExceeded (-> 429: exc.body(), exc.headers) or TenancyUnavailable (-> 503)
    auth, ticket = admitted                                   # the key's AuthContext and its reservation
    response.headers.update(ticket.headers)                   # x-ratelimit-* on admitted requests too
    try: ... stream ...
    finally: await ticket.settle(prompt_tokens, completion_tokens_sent, cached_tokens, error=failed)

`admit_key` is one round trip: the script looks the key up as
`TenantStore.authenticate` does and then checks and reserves, atomically.
`admit(auth, ...)` is the same check for a principal authenticated already.
Either reserves 1 request, the exact prompt tokens and `max_tokens` (or the
configured default cap) output tokens; nothing is charged when it refuses.
While the ticket lives, a background task extends its concurrency lease every
`heartbeat_s`; a gateway that dies stops extending, and its slots free
themselves `lease_s` later. `settle` charges what the client was actually sent,
refunds the rest of the reservation (never more), records usage, and releases
the lease; a second settle of the same reservation changes nothing. If Redis
is down at settle time the settlement is retried in the background.
The scripts run over one pipelined connection (`script_channel.py`; redis-py's
EVALSHA for TLS clients). Nothing here imports the HTTP app.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis

from gateway.background_tasks import cancel_and_wait
from gateway.tenancy import keys
from gateway.tenancy.errors import InvalidArgument, QuotaExceeded, TenancyUnavailable
from gateway.tenancy.limiter_lua import ADMIT, AUTH_ADMIT, HEARTBEAT, SETTLE
from gateway.tenancy.redis_conn import ping, text, unavailable_on_failure
from gateway.tenancy.script_channel import Script, ScriptChannel
from gateway.tenancy.store import AuthContext, auth_context
from gateway.tenancy.tiers import DEFAULT_TIER, TIERS

log = logging.getLogger("pageserve.tenancy")


def _tier_args() -> list[str | int]:
    """Every tier's default limits, for AUTH_ADMIT to pick the caller's from: name, six limits; default first."""
    args: list[str | int] = []
    for tier in sorted(TIERS.values(), key=lambda t: t.name != DEFAULT_TIER):
        args += [tier.name, *tier.limits.as_args()]
    return args


_TIER_ARGS = _tier_args()

_WHAT = {
    "rpm": "requests per minute",
    "input_tpm": "input tokens per minute",
    "output_tpm": "output tokens per minute",
    "concurrency": "concurrent requests",
    "daily_tokens": "daily token budget",
    "monthly_tokens": "monthly token budget",
}


class Principal(Protocol):
    """Who is admitted: an AuthContext, or anything with the same three names."""

    @property
    def tenant(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    @property
    def tier(self) -> str: ...


@dataclass(frozen=True)
class AdmissionConfig:
    lease_s: float = 30.0
    """A concurrency slot of a gateway that died is free again at most this long after its last heartbeat."""
    heartbeat_s: float = 10.0
    """How often a live request extends its lease (well under lease_s)."""
    default_max_tokens: int = 4096
    """Output tokens reserved when the request gives no max_tokens."""
    reservation_ttl_s: float = 6 * 3600.0
    """An unsettled reservation (its gateway died) is forgotten after this; its reservation stays charged."""
    settled_ttl_s: float = 3600.0
    """How long a settled reservation is remembered, so that a late second settle is a no-op."""
    settle_retry_s: float = 300.0
    """How long a settlement is retried in the background while Redis is unreachable."""

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.lease_s:
            raise InvalidArgument(f"heartbeat_s ({self.heartbeat_s}) must be > 0 and < lease_s ({self.lease_s})")


@dataclass(frozen=True)
class Settlement:
    status: str
    """"settled" (now), "already" (an earlier settle did it), "unknown" (no such reservation), "deferred" (Redis down)."""
    charged_tokens: int = 0
    refunded_tokens: int = 0


def format_duration(ms: int) -> str:
    """OpenAI's reset format: "250ms", "1.5s", "6m0s", "2h3m0s"."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    s = ms // 1000
    h, m, sec = s // 3600, (s % 3600) // 60, s % 60
    return (f"{h}h" if h else "") + f"{m}m{sec}s"


def _weight_arg(weight: float) -> str:
    if not 0 < weight <= 1000:
        raise InvalidArgument(f"a model cost weight must be in (0, 1000], got {weight}")
    return repr(float(weight))


def ratelimit_headers(values: list[int]) -> dict[str, str]:
    """x-ratelimit-{limit,remaining,reset}-{requests,tokens} from the script's six numbers (-1 = none)."""
    headers: dict[str, str] = {}
    for kind, (limit, remaining, reset_ms) in (("requests", values[0:3]), ("tokens", values[3:6])):
        if limit >= 0:
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
            headers[f"x-ratelimit-reset-{kind}"] = format_duration(reset_ms)
    return headers


def rejection(fields: list[int | str], headers: dict[str, str]) -> QuotaExceeded:
    field, scope = str(fields[0]), str(fields[1])
    limit, need, avail, retry_ms, fits = (int(x) for x in fields[2:7])
    what = _WHAT[field]
    budget = field.endswith("_tokens")
    if not fits:
        message = (f"Request too large for {scope}: it needs {need} against a {what} limit of {limit}, "
                   "so it can never be admitted; reduce the prompt or max_tokens, or raise the limit.")
    elif budget:
        message = (f"You exceeded the {what} of {scope}: limit {limit}, remaining {avail}, this request "
                   f"reserves {need} (prompt + max_tokens). It resets in {format_duration(retry_ms)}.")
    elif field == "concurrency":
        message = f"Too many concurrent requests for {scope}: limit {limit}. Please try again in 1s."
    else:
        message = (f"Rate limit reached for {scope} on {what}: limit {limit}, available {avail}, "
                   f"requested {need}. Please try again in {format_duration(retry_ms)}.")
    exc = QuotaExceeded(message=message, limit_type="tokens" if field.endswith(("tpm", "tokens")) else "requests",
                        code="insufficient_quota" if budget else "rate_limit_exceeded",
                        retry_after_ms=retry_ms, fits=bool(fits), limit=field)
    exc.headers = {**headers, "retry-after": str(exc.retry_after_s), "retry-after-ms": str(retry_ms)}
    return exc


class Admission:
    def __init__(self, client: aioredis.Redis, prefix: str = "ps", config: AdmissionConfig | None = None,
                 pipelined: bool = True) -> None:
        """pipelined=False runs the scripts through the redis-py client, as TLS clients always do."""
        self.redis = client
        self.prefix = prefix
        self.config = config or AdmissionConfig()
        self._channel = ScriptChannel.for_client(client) if pipelined else None
        self._admit = self._script(ADMIT)
        self._auth_admit = self._script(AUTH_ADMIT)
        self._heartbeat = self._script(HEARTBEAT)
        self._settle = self._script(SETTLE)
        self._tasks: set[asyncio.Task[None]] = set()
        self._times = [int(self.config.lease_s * 1000), int(self.config.reservation_ttl_s * 1000)]

    def _script(self, source: str) -> Callable[[list[Any]], Awaitable[Any]]:
        """`run(args)` for one script: over the pipelined channel, or redis-py's EVALSHA where there is none."""
        channel = self._channel
        if channel is None:
            registered = self.redis.register_script(source)
            return lambda args: registered(args=args)
        script = Script(source)
        return lambda args: channel.run(script, args)

    async def ping(self) -> bool:
        """True when Redis answers (for /health); never raises."""
        return await ping(self.redis)

    async def admit(self, auth: Principal, prompt_tokens: int, max_tokens: int | None, model: str = "",
                    weight: float = 1.0) -> Ticket:
        """Reserve and return a ticket, or raise QuotaExceeded / TenancyUnavailable.

        model: the served model id (after `model_access.resolve_model`); its per-tenant limits are
        checked and charged in the same script call as the tenant's and the key's ('' for none); `weight`:
        its cost weight, its tokens counting ceil(tokens x weight) against the tenant's and key's token limits.

        max_tokens: the most output tokens the request may produce in total
        (n x max_tokens for n samples); None reserves the default cap.
        """
        output = self._output(prompt_tokens, max_tokens)
        tier = TIERS.get(auth.tier, TIERS[DEFAULT_TIER])
        rid = uuid.uuid4().hex
        args: list[str | int] = [self.prefix, auth.tenant, auth.key_id, rid, prompt_tokens, output,
                                 *self._times, *tier.limits.as_args(), model, _weight_arg(weight)]
        with unavailable_on_failure():
            reply = await self._admit(args)
        return self._ticket(reply, rid, auth, prompt_tokens, output, model)

    async def admit_key(self, plaintext: str, prompt_tokens: int, max_tokens: int | None,
                        model: str = "", weight: float = 1.0) -> tuple[AuthContext, Ticket] | None:
        """Authenticate a bearer key and admit its request in one Redis round trip (the gateway's hot path).

        None when the key must get 401 (malformed, unknown, revoked, past its
        rotation grace, tenant suspended or deleted); nothing is charged then.
        The key is looked up on every call, never cached, so a revocation or
        suspension holds from the very next request. Otherwise as `admit`.
        """
        output = self._output(prompt_tokens, max_tokens)
        if not keys.looks_like_key(plaintext):
            return None
        rid = uuid.uuid4().hex
        args = [self.prefix, keys.hash_key(plaintext), rid, prompt_tokens, output, *self._times, model,
                _weight_arg(weight), *_TIER_ARGS]
        with unavailable_on_failure():
            reply = await self._auth_admit(args)
        if int(reply[0]) == -1:
            return None
        key_id, tenant, tenant_id, tier, salt, models, aliases = (text(x) for x in reply[-7:])
        auth = auth_context(key_id, tenant_id, tenant, tier, salt, models, aliases)
        return auth, self._ticket(reply, rid, auth, prompt_tokens, output, model)

    def _output(self, prompt_tokens: int, max_tokens: int | None) -> int:
        output = self.config.default_max_tokens if max_tokens is None else max_tokens
        if prompt_tokens < 0 or output < 0:
            raise InvalidArgument(f"token counts must be >= 0 (prompt {prompt_tokens}, output {output})")
        return output

    def _ticket(self, reply: list[Any], rid: str, auth: Principal, prompt_tokens: int, output: int,
                model: str = "") -> Ticket:
        """The admission script's reply as a ticket (its lease kept alive), or the QuotaExceeded it means."""
        if int(reply[0]) == 0:
            raise rejection(list(reply[1:8]), ratelimit_headers([int(x) for x in reply[8:14]]))
        ticket = Ticket(self, rid, auth, prompt_tokens, output, ratelimit_headers([int(x) for x in reply[1:7]]),
                        model)
        if int(reply[7]):
            ticket._heartbeat_task = self._spawn(ticket._keep_alive())
        return ticket

    async def heartbeat(self, reservation_id: str, tenant: str = "", key_id: str = "", model: str = "") -> bool:
        """Extend the reservation's leases by lease_s; False if it holds none (settled, or unlimited).
        If Redis lost the reservation (a restart) while the request runs, its leases under `tenant`
        and `key_id` are re-established, so the concurrency limit holds again once Redis is back."""
        args = [self.prefix, reservation_id, int(self.config.lease_s * 1000), tenant, key_id, model]
        with unavailable_on_failure():
            status = int(await self._heartbeat(args))
        if status == 2:
            log.warning("reservation %s of tenant %s: lease re-established after Redis lost it", reservation_id,
                        tenant)
        return status > 0

    async def settle_reservation(self, reservation_id: str, prompt_tokens: int, completion_tokens: int,
                                 cached_tokens: int = 0, error: bool = False) -> Settlement:
        """Settle by id, exactly once (raises TenancyUnavailable; `Ticket.settle` retries instead)."""
        for name, value in (("prompt", prompt_tokens), ("completion", completion_tokens), ("cached", cached_tokens)):
            if value < 0:
                raise InvalidArgument(f"{name} tokens must be >= 0, got {value}")
        args: list[str | int] = [self.prefix, reservation_id, prompt_tokens, completion_tokens,
                                 min(cached_tokens, prompt_tokens), int(error),
                                 int(self.config.settled_ttl_s * 1000)]
        with unavailable_on_failure():
            status, charged, refunded = (int(x) for x in await self._settle(args))
        return Settlement({1: "settled", 0: "already", -1: "unknown"}[status], charged, refunded)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Stop heartbeats and pending settlement retries, close the channel (lifespan shutdown)."""
        await cancel_and_wait(self._tasks)
        if self._channel is not None:
            await self._channel.aclose()


class Ticket:
    """One admitted request: its rate-limit headers, its lease heartbeat and its settlement."""

    def __init__(self, admission: Admission, reservation_id: str, auth: Principal, prompt_tokens: int,
                 output_tokens: int, headers: dict[str, str], model: str = "") -> None:
        self.admission = admission
        self.reservation_id = reservation_id
        self.auth = auth
        self.reserved_prompt_tokens = prompt_tokens
        self.reserved_output_tokens = output_tokens
        self.headers = headers
        """x-ratelimit-* values for the response (empty kinds are unlimited)."""
        self.model = model
        """The served model id whose per-tenant limits this reservation holds ('' for none)."""
        self._heartbeat_task: asyncio.Task[None] | None = None

    async def _keep_alive(self) -> None:
        cfg = self.admission.config
        while True:
            await asyncio.sleep(cfg.heartbeat_s)
            try:
                if not await self.admission.heartbeat(self.reservation_id, self.auth.tenant, self.auth.key_id,
                                                      self.model):
                    log.warning("reservation %s of tenant %s lost its lease", self.reservation_id, self.auth.tenant)
                    return
            except TenancyUnavailable:
                log.warning("lease heartbeat for reservation %s failed: Redis is unreachable", self.reservation_id)

    async def settle(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                     error: bool = False) -> Settlement:
        """Charge what the client was sent; idempotent; never raises for Redis being down."""
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None
        args = (self.reservation_id, prompt_tokens, completion_tokens, cached_tokens, error)
        try:
            return await self.admission.settle_reservation(*args)
        except TenancyUnavailable:
            log.warning("settling reservation %s deferred: Redis is unreachable", self.reservation_id)
            self.admission._spawn(self._retry_settle(args))
            return Settlement("deferred")

    async def _retry_settle(self, args: tuple[str, int, int, int, bool]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.admission.config.settle_retry_s
        delay = 0.25
        while loop.time() < deadline:
            await asyncio.sleep(delay)
            try:
                await self.admission.settle_reservation(*args)
                return
            except TenancyUnavailable:
                delay = min(delay * 2, 5.0)
        log.error("gave up settling reservation %s: Redis unreachable for %.0f s; its reservation stays charged",
                  self.reservation_id, self.admission.config.settle_retry_s)
