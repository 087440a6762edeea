"""Many machines: rollbox on a Ray cluster, one rollbox daemon per node (see backend.py).

Importing this package does not import Ray; `init()` does. Importing it registers the "ray"
backend with the SDK (`rollbox.sdk.backends.register_backend`: the SDK never imports this
package), and `init()` makes it the default of `SandboxPool` and `@function` in this process
(`set_default_backend`), the way `ray.init()` itself is process-wide.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sdk import backends
from ..sdk.backends import resolve_backend

if TYPE_CHECKING:
    from ..sdk.backends import PoolBackend, PoolSpec
    from ..sdk.function import Function
    from .backend import RayConfig

NAME = "ray"
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
    backends.set_default_backend(NAME)


def config() -> "RayConfig":
    """The configuration `init()` set, or the default one (connect to RAY_ADDRESS or start locally)."""
    from .backend import RayConfig

    return _configured[0] if _configured else RayConfig()


class RayBackend:
    """The "ray" backend of the SDK (`rollbox.sdk.backends.Backend`); imports Ray on first use."""

    def open_pool(self, spec: "PoolSpec") -> "PoolBackend":
        from .backend import RayPool

        return RayPool(spec, config())

    def call_function(self, fn: "Function[Any]", args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from .backend import call_function

        return call_function(config(), fn, args, kwargs)


backends.register_backend(NAME, RayBackend())

__all__ = ["RayBackend", "init", "resolve_backend", "config"]
