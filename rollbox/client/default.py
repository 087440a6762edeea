"""The process-wide default `Client`, shared by every SDK object made without `client=`."""

from __future__ import annotations

import threading

from .transport import Client

_shared_client: list[Client] = []
_shared_lock = threading.Lock()


def default_client() -> Client:
    """One client per process, made on first use (connection pooling across sandboxes and
    threads: 64 threads' first calls at once still share one)."""
    if not _shared_client:
        with _shared_lock:
            if not _shared_client:
                _shared_client.append(Client())
    return _shared_client[0]


__all__ = ["default_client"]
