"""`pageserve up` never puts the Redis URL (it may hold a password) in a child's argv, and prints it redacted."""

from __future__ import annotations

from gateway.tenancy.redis_conn import redact_url
from ops.launcher import LaunchConfig, gateway_command

SECRET_URL = "redis://default:hunter2-secret@10.0.0.5:6380/0"


def test_the_redis_url_goes_by_environment_not_argv() -> None:
    argv, env = gateway_command(["python", "-m", "ops.cli"], LaunchConfig(), "tcp://127.0.0.1:5555", SECRET_URL)
    assert not any("hunter2" in a or "redis://" in a for a in argv)
    assert "--redis-url" not in argv
    assert env == {"PAGESERVE_REDIS_URL": SECRET_URL}


def test_redacted_urls_keep_the_host_and_drop_the_credentials() -> None:
    assert redact_url(SECRET_URL) == "redis://***@10.0.0.5:6380/0"
    assert redact_url("rediss://:pw@h:1/2") == "rediss://***@h:1/2"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("unix:///tmp/redis.sock") == "unix:///tmp/redis.sock"
