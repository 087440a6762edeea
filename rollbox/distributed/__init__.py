"""Many machines: rollbox on a Ray cluster, one rollbox daemon per node (see backend.py).

Importing this package does not import Ray; `init()` does. `init()` is the one process-wide
setting of the SDK: it makes `backend="ray"` the default of `SandboxPool` and `@function`
in this process, the way `ray.init()` itself is process-wide.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import errors

if TYPE_CHECKING:
    from .backend import RayConfig

BACKENDS = ("local", "ray")
# Set by init(): [RayConfig]. A list, so that there is no rebinding of a module global.
_configured: list["RayConfig"] = []


def init(address: str | None = None, *, transfer_dir: str | Path | None = None, **ray_kwargs: Any) -> None:
    """Connects this process to a Ray cluster and makes it the default backend.

    Args:
        address: a Ray address ("ray://head:10001", "10.0.0.1:6379", "auto"); None: RAY_ADDRESS
            or a new local cluster. Passed to `ray.init` with `ray_kwargs`.
        transfer_dir: a directory every node can read (NFS, ...) through which snapshots and
            images travel; None: Ray's object store.

    Raises:
        RuntimeMissing: Ray is not installed (`pip install 'rollbox[ray]'`).
    """
    import logging

    from .backend import RayConfig, require_ray

    ray = require_ray()
    if not ray.is_initialized():
        ray_kwargs.setdefault("logging_level", logging.WARNING)
        ray_kwargs.setdefault("log_to_driver", False)
        ray.init(address=address, **ray_kwargs)
    _configured[:] = [RayConfig(address, Path(transfer_dir) if transfer_dir is not None else None)]


def resolve_backend(backend: str | None) -> str:
    """`backend` checked, or the default: "ray" after `init()`, else "local".

    Raises:
        InvalidArgument: not one of "local", "ray".
    """
    if backend is None:
        return "ray" if _configured else "local"
    if backend not in BACKENDS:
        raise errors.InvalidArgument(f"backend={backend!r} must be one of {', '.join(map(repr, BACKENDS))}")
    return backend


def config() -> "RayConfig":
    """The configuration `init()` set, or the default one (connect to RAY_ADDRESS or start locally)."""
    from .backend import RayConfig

    return _configured[0] if _configured else RayConfig()


__all__ = ["init", "resolve_backend", "config"]
