"""The channel's frame primitives, shared by agent.py and zygotelink.py: the 4-byte length header,
HMAC-SHA256 (without loading OpenSSL), exact reads, and the lock every writer of the daemon's
channel holds for a whole frame. Sending (the key, the output fd) stays in agent.py.

This file runs under the image's own `python3` next to agent.py and imports nothing outside
the standard library.
"""

import os
import struct
import threading
from _operator import _compare_digest  # noqa: F401  constant time; `hmac` would load OpenSSL (+6 MiB)

_HDR = struct.Struct(">I")
MAX_FRAME = 1024 * 1024 * 1024
# Held for a whole frame by every writer of the daemon's channel (agent.send, ZygoteLink).
_out_lock = threading.Lock()

try:
    # The small built-in SHA-256: importing hashlib loads OpenSSL, ~6.5 MiB more per sandbox.
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover - Python builds without it
    from hashlib import sha256 as _sha256


_pads: dict = {}  # type: ignore[type-arg]


def hmac_sha256(key, data):
    """RFC 2104 HMAC with SHA-256 (block size 64), equal to hmac.new(key, data, sha256)."""
    pads = _pads.get(key)
    if pads is None:
        k = _sha256(key).digest() if len(key) > 64 else key
        k = k.ljust(64, b"\0")
        pads = _pads[key] = (bytes(b ^ 0x36 for b in k), bytes(b ^ 0x5C for b in k))
    inner = _sha256(pads[0] + data).digest()
    return _sha256(pads[1] + inner).digest()


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
