from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import redis_server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """One private redis-server for the whole session; tests use their own key prefixes or flush."""
    with redis_server() as url:
        yield url
