"""The process-wide default `Client`, shared by every SDK object made without `client=`."""

from __future__ import annotations

from .transport import Client

_shared_client: list[Client] = []


def default_client() -> Client:
    """One client per process, made on first use (connection pooling across sandboxes)."""
    if not _shared_client:
        _shared_client.append(Client())
    return _shared_client[0]


__all__ = ["default_client"]
