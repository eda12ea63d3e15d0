"""ZeroMQ CURVE for the engine socket: authentication and encryption between gateways and the engine.

Off by default (loopback needs neither); once engine and gateways run on different hosts the engine
socket is a trust boundary. Keys live in files made by `pageserve curve-keys DIR` (zmq.auth's
certificate format, secret files mode 0600):

    DIR/engine.key_secret      the engine's key pair        (engine: --curve-dir DIR)
    DIR/authorized/*.key       gateways the engine accepts  (engine: only these public keys get in)
    DIR/engine.key             the engine's public key      (gateway: --engine-curve-dir DIR)
    DIR/gateway.key_secret     the gateway's key pair       (gateway)

A client without an authorized key pair, or that does not know the engine's public key, completes
no handshake: it gets nothing, not even an error. Imports zmq only; no torch, no engine/, no gateway/.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    authorized: Path
    """A folder of the public keys (*.key) of the clients allowed in."""


@dataclass(frozen=True)
class ClientKeys:
    public: bytes
    secret: bytes
    server_public: bytes


def generate(folder: Path) -> None:
    """Write an engine key pair, one gateway key pair, and authorize that gateway."""
    folder.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(str(folder), "engine")
    zmq.auth.create_certificates(str(folder), "gateway")
    authorized = folder / "authorized"
    authorized.mkdir(exist_ok=True)
    shutil.copy(folder / "gateway.key", authorized / "gateway.key")
    for secret in folder.glob("*.key_secret"):
        os.chmod(secret, 0o600)


def server_keys(folder: str | Path) -> ServerKeys:
    public, secret = zmq.auth.load_certificate(str(Path(folder) / "engine.key_secret"))
    assert secret is not None
    return ServerKeys(public, secret, Path(folder) / "authorized")


def client_keys(folder: str | Path) -> ClientKeys:
    public, secret = zmq.auth.load_certificate(str(Path(folder) / "gateway.key_secret"))
    server_public, _ = zmq.auth.load_certificate(str(Path(folder) / "engine.key"))
    assert secret is not None
    return ClientKeys(public, secret, server_public)


def serve_curve(ctx: zmq.Context, sock: zmq.Socket, keys: ServerKeys) -> ThreadAuthenticator:
    """Make `sock` (before bind) a CURVE server accepting only the authorized public keys.
    The returned authenticator thread must be stopped when the socket closes."""
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.authorized))
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    return auth


def connect_curve(sock: zmq.Socket, keys: ClientKeys) -> None:
    """Make `sock` (before connect) a CURVE client of the engine whose public key is `keys.server_public`."""
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    sock.curve_serverkey = keys.server_public


def main(argv: list[str]) -> int:
    """`pageserve curve-keys DIR`: make the key files (see the module docstring for who reads which)."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: pageserve curve-keys DIR", file=sys.stderr)
        return 2
    generate(Path(argv[0]))
    print(f"CURVE keys written to {argv[0]}: engine --curve-dir {argv[0]}, gateway --engine-curve-dir {argv[0]} "
          "(copy engine.key and gateway.key_secret to the gateway's host only)")
    return 0
