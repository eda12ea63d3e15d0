"""API key material: generation, hashing and the display hint. Nothing here touches Redis.

A key is `ps-` followed by 43 URL-safe characters (32 random bytes, 256 bits).
Only `sha256(key)` is stored. A slow password hash (bcrypt, argon2) protects
low-entropy human passwords against offline guessing; a 256-bit random key
cannot be guessed either way, and a fast deterministic hash lets the gateway
find the key record with one lookup per request instead of scanning salts.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "ps-"


def new_key() -> str:
    """A fresh plaintext key, to be shown exactly once."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def key_hint(plaintext: str) -> str:
    """What listings show to tell keys apart: the prefix and the last four characters."""
    return f"{KEY_PREFIX}...{plaintext[-4:]}"


def looks_like_key(text: str) -> bool:
    """Cheap shape check so garbage bearer tokens never cost a Redis round trip."""
    return text.startswith(KEY_PREFIX) and 20 <= len(text) <= 200
