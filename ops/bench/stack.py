"""`bench serve --spawn`: our whole stack on loopback for one benchmark run, and gone after it.

    with SpawnedStack(model="smollm2", tenants=["default"], engine_args=["--dtype", "float32"]) as s:
        s.base_url, s.engine_address, s.keys      # keys: tenant -> fresh API key

A private redis-server, `pageserve engine` and `pageserve gateway` (the launcher's
pieces: start_redis, free_port, stop_all), one standard-tier tenant per name with a
fresh key, and process logs in a temporary folder (named when start-up fails,
deleted on a clean exit). This module owns process lifetimes, nothing of the load.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from ops.launcher import (
    HEALTH_TIMEOUT_S,
    Child,
    create_demo_key,
    free_port,
    start_redis,
    stop_all,
    wait_healthy,
)

REDIS_PREFIX = "bench"


class SpawnedStack:
    def __init__(self, model: str, tenants: list[str], engine_args: list[str]) -> None:
        self.model = model
        self.tenants = tenants
        self.engine_args = engine_args
        self.children: list[Child] = []
        self.logs = Path(tempfile.mkdtemp(prefix="pageserve-bench-"))
        self.base_url = ""
        self.engine_address = ""
        self.keys: dict[str, str] = {}

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.logs / f"{name}.log", "wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen([sys.executable, "-m", "ops.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.children.append(Child(name, proc))

    def start(self) -> None:
        redis, redis_url = start_redis()
        self.children.append(redis)
        self.engine_address = f"tcp://127.0.0.1:{free_port()}"
        port = free_port()
        self._spawn("engine", ["engine", "--model", self.model, "--listen", self.engine_address, *self.engine_args])
        self._spawn("gateway", ["gateway", "--engine", self.engine_address, "--redis-url", redis_url,
                                "--port", str(port), "--model", self.model, "--redis-prefix", REDIS_PREFIX,
                                "--engine-timeout", str(HEALTH_TIMEOUT_S)])
        self.base_url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(self.base_url + "/health", self.children, HEALTH_TIMEOUT_S)
        except RuntimeError as e:
            raise RuntimeError(f"{e} (logs in {self.logs})") from None
        self.keys = {t: asyncio.run(create_demo_key(redis_url, REDIS_PREFIX, t)) for t in self.tenants}

    def stop(self) -> None:
        stop_all(self.children)
        self.children.clear()

    def __enter__(self) -> SpawnedStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        if exc_type is None:
            shutil.rmtree(self.logs, ignore_errors=True)
