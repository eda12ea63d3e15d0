"""The gateway's configuration: frozen dataclasses, built once by `gateway/server.py` from flags and env.

Values learned at start-up (the engine's model name and context length, the
tokenizer) live in the lifespan state, never written back here. Every range is
checked here, once: a bad value raises `ConfigError` naming the flag, and the
process stops before it serves anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.replicas.config import ReplicasConfig
from gateway.tenancy.admission import AdmissionConfig


class ConfigError(ValueError):
    """A setting out of range; the message names the flag."""


@dataclass(frozen=True)
class ModelsConfig:
    """Several models behind one gateway (gateway/served_models.py, issue 42)."""

    extra: tuple[str, ...] = ()
    """Model specs beyond `GatewayConfig.model` (`--model` repeated): their tokenizers are loaded too."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Requested name -> served model id, for every tenant (`--model-alias NAME=ID`)."""
    fallbacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Model id -> ids tried in order when it has no live replica, is cooling down, or its context is
    too short for the request (`--model-fallback ID=A,B`); only those the tenant may use."""
    cooldown_s: float = 10.0
    """How long a model whose engine failed a request is passed over for its fallbacks."""
    cost_weights: dict[str, float] = field(default_factory=dict)
    """Model id -> weight: its tokens count ceil(tokens x weight) against tenant-wide and key token limits
    and budgets (`--model-cost-weight ID=W`; default 1), so one budget is fair across small and large models."""


@dataclass(frozen=True)
class GatewayConfig:
    engine_address: str = "tcp://127.0.0.1:5555"
    """ZeroMQ address the engine listens on (tcp://host:port or ipc://path)."""
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    """Several engines (listed, or announced in Redis): routed per request (gateway/replicas/)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Tenants, hashed API keys and quotas live here."""
    model: str = "smollm2"
    """Model spec for `resolve_model`: the tokenizer comes from the same folder the engine uses."""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    """More models, aliases, fallbacks (the first model is `model`)."""
    host: str = "127.0.0.1"
    port: int = 8000
    redis_prefix: str = "ps"
    """Namespace of every Redis key the tenancy store touches."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """Quota admission: concurrency lease, heartbeat, default output-token cap (gateway/tenancy/admission.py)."""
    admin_token: str | None = field(default=None, repr=False)
    """Bearer token of the /admin routes (PAGESERVE_ADMIN_TOKEN only, never a flag); None disables them."""
    engine_connect_timeout_s: float = 180.0
    """How long start-up waits for the engine's handshake (it may still be loading the model)."""
    redis_down_fail_open: frozenset[str] = frozenset()
    """Tenants served without quotas while Redis is down (gateway/tenancy/outage_policy.py); others get 503."""
    engine_curve_dir: str | None = None
    """ZeroMQ CURVE keys for the engine socket (shared/curve.py: engine.key, gateway.key_secret); None: plain."""
    engine_retry_interval_s: float = 1.0
    """How often a lost engine connection is retried while the gateway runs."""
    engine_poll_interval_s: float = 1.0
    """How often the engine's Stats (its step counter: the heartbeat, and the /metrics figures) are read."""
    engine_stall_s: float = 60.0
    """With work in flight and no engine step for this long, open requests fail and /ready is 503."""
    completion_default_max_tokens: int = 16
    """`/v1/completions` without max_tokens (OpenAI's default); chat uses the room left in the context."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Larger request bodies get a 413 before they are buffered (a whole context of text is ~100 KB)."""
    body_timeout_s: float = 30.0
    """A request body must arrive whole within this (after the key was verified), else a 408."""
    redis_timeout_s: float = 1.0
    """Connect timeout of a Redis call (reads wait at least 2 s): past it, admission fails closed with a 503."""
    redis_max_connections: int = 64
    redis_pool_wait_s: float = 5.0
    """How long a request waits for a pooled Redis connection while all are busy."""
    request_deadline_s: float | None = None
    """Each request is aborted and settled after this long (None: no deadline); enforced by serving."""
    drain_s: float = 30.0
    """After SIGTERM, open requests get this long to finish before they end with an error event."""
    trusted_request_id: bool = False
    """Use the client's x-request-id (set by a proxy in front that we trust) instead of our own."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed to call the API (CORS); empty: no CORS headers."""
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    """HTTPS for the listener (uvicorn): both or neither."""
    metrics_dir: str | None = None
    """Where worker processes keep their metric values (PROMETHEUS_MULTIPROC_DIR); None: a fresh temp dir."""
    log_level: str = "info"
    log_format: str = "text"
    """"text", or "json": one JSON object a line (python-json-logger)."""
    workers: int = 1
    """Gateway processes sharing the port (uvicorn workers); each has its own engine client and tokenizer."""

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.port <= 65535, "--port", "must be in 1..65535"),
            (self.workers >= 1, "--workers", "must be at least 1"),
            (self.max_body_bytes >= 1024, "--max-body-bytes", "must be at least 1024"),
            (self.engine_connect_timeout_s > 0, "--engine-timeout", "must be positive"),
            (self.engine_poll_interval_s > 0, "--engine-poll-interval", "must be positive"),
            (self.engine_retry_interval_s > 0, "--engine-retry-interval", "must be positive"),
            (self.engine_stall_s > self.engine_poll_interval_s, "--engine-stall",
             "must be longer than --engine-poll-interval"),
            (self.redis_timeout_s > 0, "--redis-timeout", "must be positive"),
            (self.redis_max_connections >= 1, "--redis-max-connections", "must be at least 1"),
            (self.redis_pool_wait_s > 0, "--redis-pool-wait", "must be positive"),
            (self.request_deadline_s is None or self.request_deadline_s > 0, "--request-deadline",
             "must be positive (or 0 for none)"),
            (self.drain_s >= 0, "--drain-time", "must be 0 or more"),
            (self.completion_default_max_tokens >= 1, "--completion-default-max-tokens", "must be at least 1"),
            ((self.tls_certfile is None) == (self.tls_keyfile is None), "--tls-certfile",
             "and --tls-keyfile go together"),
            (self.log_format in ("text", "json"), "--log-format", "must be text or json"),
            (self.models.cooldown_s >= 0, "--model-cooldown", "must be 0 or more"),
            (self.log_level.lower() in ("critical", "error", "warning", "info", "debug"), "--log-level",
             "must be one of critical, error, warning, info, debug"),
        ]
        for ok, flag, problem in checks:
            if not ok:
                raise ConfigError(f"invalid setting {flag}: {problem}")
