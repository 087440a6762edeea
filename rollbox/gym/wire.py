"""The wire format between the trainer and the env server in a sandbox (stdlib + numpy only).

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON. Values that JSON
cannot carry travel as one-key objects whose key starts with NUL:

    {"\\x00nd": [dtype, shape, base64]}   numpy array (numeric, bool, bytes or str dtypes only)
    {"\\x00np": [dtype, base64]}          numpy scalar (np.float32(1.0) stays a float32)
    {"\\x00t": [...]}                     tuple
    {"\\x00b": base64}                    bytes
    {"\\x00d": [[key, value], ...]}       dict with keys other than plain strings
    {"\\x00r": text}                      anything else, as its repr (decoded as `RemoteRepr`)

Decoding never builds objects of arbitrary classes (no pickle): a sandbox's env is untrusted
code, and what it sends is data only. This module is also shipped into the sandbox.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
from typing import Any

import numpy as np

MAX_FRAME_BYTES = 256 * 1024 * 1024
_LEN = struct.Struct(">I")
_KINDS = frozenset("biufcSU")  # bool, ints, floats, complex, bytes, str: plain memory, no objects


class WireError(Exception):
    """A frame or value that does not follow this format (a broken or hostile peer)."""


class RemoteRepr(str):
    """A value the env returned that has no wire form (an arbitrary object): its repr."""


def _dtype(name: object) -> np.dtype[Any]:
    try:
        dt = np.dtype(str(name))
    except TypeError as e:
        raise WireError(f"unknown dtype {name!r}") from e
    if dt.kind not in _KINDS or dt.fields is not None or dt.subdtype is not None:
        raise WireError(f"dtype {dt} cannot cross the wire (numeric, bool, bytes or str only)")
    return dt


def encode(value: Any, *, strict: bool = False) -> Any:
    """A JSON-able tree for `value`. strict: raise WireError instead of sending a repr."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and type(value) in (int, float):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _KINDS or value.dtype.fields is not None:
            if strict:
                raise WireError(f"an array of dtype {value.dtype} cannot cross the wire")
            return {"\x00r": repr(value)}
        return {"\x00nd": [value.dtype.str, list(value.shape),
                           base64.b64encode(np.ascontiguousarray(value).tobytes()).decode()]}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _KINDS:
            return {"\x00r": repr(value)}
        return {"\x00np": [value.dtype.str, base64.b64encode(value.tobytes()).decode()]}
    if isinstance(value, tuple):
        return {"\x00t": [encode(v, strict=strict) for v in value]}
    if isinstance(value, list):
        return [encode(v, strict=strict) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("\x00") for k in value):
            return {k: encode(v, strict=strict) for k, v in value.items()}
        return {"\x00d": [[encode(k, strict=strict), encode(v, strict=strict)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"\x00b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (int, float)):  # int/float subclasses (e.g. IntEnum)
        return int(value) if isinstance(value, int) else float(value)
    if strict:
        raise WireError(f"a {type(value).__name__} cannot cross the sandbox boundary (use numbers, "
                        "strings, lists, tuples, dicts or numpy arrays)")
    return {"\x00r": repr(value)}


def _array(dtype: object, shape: object, data: object) -> np.ndarray:
    dt = _dtype(dtype)
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise WireError(f"bad array shape {shape!r}")
    raw = bytearray(base64.b64decode(str(data), validate=True))  # bytearray: a writable array
    count = 1
    for n in shape:
        count *= n
    if len(raw) != count * dt.itemsize:
        raise WireError(f"array of shape {shape} and dtype {dt} needs {count * dt.itemsize} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def decode(tree: Any) -> Any:
    """The value `encode` made (raises WireError on anything malformed)."""
    if isinstance(tree, list):
        return [decode(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        (key, arg), = tree.items()
        if key.startswith("\x00"):
            try:
                if key == "\x00nd":
                    dtype, shape, data = arg
                    return _array(dtype, shape, data)
                if key == "\x00np":
                    dtype, data = arg
                    return _array(dtype, [], data)[()]
                if key == "\x00t":
                    return tuple(decode(v) for v in arg)
                if key == "\x00b":
                    return base64.b64decode(str(arg), validate=True)
                if key == "\x00d":
                    out = {}
                    for k, v in arg:
                        k = decode(k)
                        if isinstance(k, (list, dict, np.ndarray)):
                            raise WireError(f"unhashable dict key {k!r}")
                        out[k] = decode(v)
                    return out
                if key == "\x00r":
                    return RemoteRepr(str(arg))
            except (TypeError, ValueError) as e:
                raise WireError(f"malformed {key[1:]!r} value: {e}") from e
            raise WireError(f"unknown wire marker {key[1:]!r}")
    return {k: decode(v) for k, v in tree.items()}


def dumps(msg: Any) -> bytes:
    """One frame: length + compact JSON of an already-encoded tree."""
    body = json.dumps(msg, separators=(",", ":"), allow_nan=True).encode()
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, msg: Any) -> None:
    sock.sendall(dumps(msg))


def recv(reader: Any) -> Any | None:
    """The next frame's JSON from a binary file-like `reader` (sock.makefile("rb")), or None on
    a clean end of stream before a frame. Raises WireError on a truncated or oversized frame."""
    head = reader.read(_LEN.size)
    if not head:
        return None
    if len(head) < _LEN.size:
        raise WireError("the stream ended inside a frame header")
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME_BYTES:
        raise WireError(f"a frame of {n} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    body = reader.read(n)
    if len(body) < n:
        raise WireError(f"the stream ended inside a frame ({len(body)} of {n} bytes)")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise WireError(f"a frame that is not JSON: {e}") from e
