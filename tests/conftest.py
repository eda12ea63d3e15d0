from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support import ast_parse_retry
from tests.support.redis_server import redis_server

ast_parse_retry.install()

# Triton reads TRITON_INTERPRET when a kernel is decorated (module import): set it before any test module
# imports a kernel, so every kernel in this session is interpreted (tests/kernels/conftest.py explains;
# an explicit TRITON_INTERPRET=0 for the gpu tests is kept).
os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs redis-server says so by its fixture; the marker follows from it, so
    `pytest -m "not slow and not redis"` is the fast loop without any server."""
    for item in items:
        if "redis_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """One private redis-server for the whole session; tests use their own key prefixes or flush."""
    with redis_server() as url:
        yield url
