"""Execution backends of `SandboxPool` and `@function`: the public plug-in point.

"local" is built in: episodes and calls run on this machine's daemon. Another backend
(rollbox.distributed's "ray") registers itself here with `register_backend` when its package
is imported; the SDK never imports it. A backend runs a pool's episodes elsewhere and talks
back to the SDK only through what this module names:

- `Backend.open_pool(PoolSpec)` makes the remote side of one pool (`PoolBackend`), which the
  pool drives: `map`, `close`, `delete_snapshot`;
- `Backend.call_function(fn, args, kwargs)` runs one `Function.remote` call elsewhere;
- on the far side, a node runs episodes through a node-local `SandboxPool` with its public
  `attempt()` (classified exactly as `map` classifies them, an `AttemptOutcome`) and
  `terminate_live()`, and calls through `Function(fn.fn, spec, client).remote(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .. import errors
from ..client.transport import Client
from ..types import EpisodeResult

if TYPE_CHECKING:
    from .function import Function
    from .sandbox import SandboxInstance

LOCAL = "local"

EpisodeFn = Callable[["SandboxInstance", Any], Any]


@dataclass(frozen=True)
class PoolSpec:
    """What a backend needs to know of a `SandboxPool` to run its episodes elsewhere.

    `client`: the pool's client (its `paths` is this machine's state directory, from which a
    backend ships the snapshot); the other fields are the pool's own arguments and id (every
    episode sandbox carries `pool_id` as its `rollbox.pool` tag).
    """

    pool_id: str
    snapshot_id: str
    max_concurrency: int
    keep_warm_seconds: float | None
    warm: int
    warm_idle_seconds: float
    client: Client
    isolation: str = "sandbox"  # SandboxPool's: "sandbox" or "container"
    runtime: str = "gvisor"  # SandboxPool's: "gvisor" or "runc" (container mode only)


class AttemptOutcome(NamedTuple):
    """One episode attempt on one fresh sandbox, as `SandboxPool.attempt` classified it.

    `status`: ok, timeout, oom, error or infra_error; `value`: the episode's return value (for
    ok, and for a timeout that returned); `ttfc_ms`: milliseconds to a usable sandbox (None
    when none was made); `retryable`: an infrastructure fault that a fresh sandbox may not hit.
    """

    status: str
    value: Any
    error: str | None
    sandbox_id: str | None
    ttfc_ms: float | None
    retryable: bool


class PoolBackend(Protocol):
    """The remote side of one `SandboxPool` (made by `Backend.open_pool`, driven by the pool)."""

    def map(self, fn: EpisodeFn, tasks: Iterable[Any], *, timeout: float | None, retries: int,
            ordered: bool, progress: bool | None) -> Iterator[EpisodeResult]:
        """`SandboxPool.map` elsewhere: same arguments, results and errors."""
        ...

    def close(self) -> None:
        """Closes the pool wherever it runs: waits for teardowns, ends its sandboxes."""
        ...

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Removes the copies of `snapshot_id` this backend made (best effort)."""
        ...


class Backend(Protocol):
    """A place to run episodes and function calls other than this machine's daemon."""

    def open_pool(self, spec: PoolSpec) -> PoolBackend:
        ...

    def call_function(self, fn: "Function[Any]", args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`fn.remote(*args, **kwargs)` elsewhere; raises what it raises, as itself."""
        ...


_registry: dict[str, Backend] = {}
_default: list[str] = []  # [name] once set_default_backend chose one; a list, not a rebound global


def register_backend(name: str, backend: Backend) -> None:
    """Makes `backend` available as `backend=name` (a second registration replaces the first).

    Raises:
        InvalidArgument: `name` is "local" (built in) or empty.
    """
    if not name or name == LOCAL:
        raise errors.InvalidArgument(f"backend name {name!r} is reserved or empty: choose another")
    _registry[name] = backend


def set_default_backend(name: str | None) -> None:
    """Makes `name` the backend of pools and functions made with `backend=None` in this
    process (`rollbox.init()` sets "ray"); None: back to "local".

    Raises:
        InvalidArgument: no backend of that name is registered.
    """
    if name is None:
        _default.clear()
        return
    _default[:] = [resolve_backend(name)]


def resolve_backend(backend: str | None) -> str:
    """`backend` checked, or the process default ("local" unless `set_default_backend`).

    Raises:
        InvalidArgument: not "local" and not a registered backend.
    """
    if backend is None:
        return _default[0] if _default else LOCAL
    if backend != LOCAL and backend not in _registry:
        names = ", ".join(repr(n) for n in (LOCAL, *sorted(_registry)))
        raise errors.InvalidArgument(f"backend={backend!r} must be one of {names}")
    return backend


def get_backend(name: str) -> Backend:
    """The registered backend `name` (not "local", which is the SDK itself).

    Raises:
        InvalidArgument: no backend of that name is registered.
    """
    resolve_backend(name)
    if name == LOCAL:
        raise errors.InvalidArgument("the 'local' backend is the SDK itself, not a registered backend")
    return _registry[name]


__all__ = ["AttemptOutcome", "Backend", "LOCAL", "PoolBackend", "PoolSpec", "get_backend", "register_backend",
           "resolve_backend", "set_default_backend"]
