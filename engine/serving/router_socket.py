"""The engine's ROUTER socket, configured and bound: the options that make it a service.

    ROUTER_MANDATORY   a send to a gone gateway raises (the server forgets it), never vanishes
    SNDHWM / RCVHWM 0  outputs are never dropped for a slow gateway
    MAXMSGSIZE         a bigger frame drops its sender
    ZMTP heartbeats    a silently dead gateway's connection drops, so its requests are aborted
    CURVE              with --curve-dir: only authorized gateways connect, traffic is encrypted

It knows nothing about messages or the loop (engine/serving/server.py).
"""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator

from engine.serving.server_config import MAX_MESSAGE_BYTES, ServerConfig
from shared.curve import serve_curve, server_keys

log = logging.getLogger("pageserve.engine")


def open_router(ctx: zmq.Context, config: ServerConfig) -> tuple[zmq.Socket, ThreadAuthenticator | None]:
    """The bound socket, and the CURVE authenticator to stop at close (None without CURVE)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone gateway raises, not vanishes
    sock.setsockopt(zmq.SNDHWM, 0)  # never drop outputs for a slow gateway
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a bigger frame drops its sender
    # ZMTP heartbeats (answered by libzmq's I/O thread even mid-step) drop a silently dead
    # gateway's connection, so the next send to it fails and its requests are aborted.
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
    auth = None if config.curve_dir is None else serve_curve(ctx, sock, server_keys(config.curve_dir))
    if auth is None and not _is_loopback(config.listen):
        log.warning("engine socket %s is not loopback and has no CURVE keys (--curve-dir): any host that "
                    "reaches it can submit requests", config.listen)
    sock.bind(config.listen)
    return sock, auth


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("tcp://").rpartition(":")[0]
    return address.startswith(("ipc://", "inproc://")) or host in ("127.0.0.1", "localhost", "[::1]")
