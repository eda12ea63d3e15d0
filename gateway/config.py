"""The gateway's configuration: one frozen dataclass, built once by `gateway/server.py`.

Values learned at start-up (the engine's model name and context length, the
tokenizer) live in the lifespan state, never written back here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.tenancy.admission import AdmissionConfig


@dataclass(frozen=True)
class GatewayConfig:
    engine_address: str = "tcp://127.0.0.1:5555"
    """ZeroMQ address the engine listens on (tcp://host:port or ipc://path)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Tenants, hashed API keys and quotas live here."""
    model: str = "smollm2"
    """Model spec for `resolve_model`: the tokenizer comes from the same folder the engine uses."""
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
    completion_default_max_tokens: int = 16
    """`/v1/completions` without max_tokens (OpenAI's default); chat uses the room left in the context."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Larger request bodies get a 413 before they are buffered (a whole context of text is ~100 KB)."""
    log_level: str = "info"
    workers: int = 1
    """Gateway processes sharing the port (uvicorn workers); each has its own engine client and tokenizer."""
