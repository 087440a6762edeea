"""`NodeDaemon`: the body of the one Ray actor per node that owns that node's rollbox daemon.

The actor (made by `backend.node_actors`, pinned with Ray's node-affinity scheduling):

- starts the node's daemon (`python -m rollbox serve`) on the node's state directory, or
  adopts one already serving it. The directory is `ROLLBOX_HOME` as the actor sees it: Ray
  workers inherit the environment of the raylet, so `ROLLBOX_HOME=/x ray start ...` chooses it;
- supervises it: when the daemon's lock is released (it died), it starts a new one, whose
  crash recovery re-attaches the sandboxes still running, and then terminates the sandboxes of
  this actor's pools (their episodes were lost with the old daemon) before taking new work;
- imports the snapshots and images it is sent (`transfer.py`), skipping what it has;
- runs episode attempts for the driver's scheduler through a node-local `SandboxPool`, so an
  episode is classified exactly as on the local backend.

An attempt that overlapped a daemon restart and did not finish `ok` is reported as a
retryable `infra_error`, whatever the error looked like (its sandbox was cut off or removed).
Thread-safety: Ray calls the methods from many threads (a threaded actor); shared state is
guarded by `_lock`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cloudpickle

from .. import errors
from ..client.transport import DAEMON_START_TIMEOUT_S, Client, daemon_running, stop_daemon
from ..config import DEFAULT_HOME, Paths
from ..sdk.backends import LOCAL
from ..sdk.function import Function
from ..sdk.pool import SandboxPool
from . import transfer

log = logging.getLogger("rollbox.distributed.node")


@dataclass(frozen=True)
class NodeInfo:
    """What a node actor reports about itself. `cpu`/`gpu`: what the node declared to Ray;
    `actor_pid`: the actor's own worker process."""

    node_id: str
    hostname: str
    home: str
    daemon_pid: int | None
    restarts: int
    cpu: float = 0.0
    gpu: float = 0.0
    actor_pid: int = 0


# Prefix of the error of an attempt sent to a node whose actor no longer knows the pool.
POOL_NOT_OPEN = "PoolNotOpen"


@dataclass(frozen=True)
class Attempt:
    """One episode attempt on one node, as `SandboxPool.attempt` classified it.

    `ttfc_ms`: milliseconds to a usable sandbox; `retryable`: an infrastructure fault that a
    fresh sandbox (preferably on another node) may not hit.
    """

    status: str
    value: Any
    error: str | None
    sandbox_id: str | None
    ttfc_ms: float | None
    retryable: bool
    node: str
    extra: dict[str, Any] = field(default_factory=dict)


class NodeDaemon:
    """Owns one node's rollbox daemon. Meant to run as a Ray actor (see module docstring).

    Args:
        home: the state directory; None: this process's ROLLBOX_HOME (default /var/lib/rollbox).
        node_id: the Ray node id this actor runs on (reported on every result).
        resources: the node's Ray resources ({"CPU": 8.0, "GPU": 1.0, ...}), reported back.
        poll_s: seconds between liveness checks of the daemon.

    Raises:
        DaemonUnavailable: the daemon could not be started (not root, runsc missing, ...).
    """

    def __init__(self, home: str | None = None, node_id: str = "", resources: dict[str, float] | None = None,
                 poll_s: float = 0.2) -> None:
        self.paths = Paths(Path(home or os.environ.get("ROLLBOX_HOME", DEFAULT_HOME)))
        self.node_id = node_id
        self.resources = dict(resources or {})
        self.poll_s = poll_s
        self._client = Client(paths=self.paths, autostart=False)  # only this actor starts the daemon
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._generation = 0
        self._restarts = 0
        self._pools: dict[str, SandboxPool] = {}
        # Every pool id this actor has served, closed ones too: a pool closed while the daemon
        # was down could not end its sandboxes, and the restarted daemon re-adopts them.
        self._served: set[str] = set()
        self._start_daemon()
        self._ready.set()
        self._watcher = threading.Thread(target=self._supervise, daemon=True, name="rollbox-node-supervisor")
        self._watcher.start()

    # ---- the daemon -------------------------------------------------------------------------

    def _start_daemon(self) -> None:
        """Starts (or adopts) the daemon and waits until it answers."""
        Client(paths=self.paths, autostart=True).ensure_daemon()

    def _daemon_pid(self) -> int | None:
        try:
            return int(self.paths.daemon_lock.read_text().strip())
        except (OSError, ValueError):
            return None

    def _supervise(self) -> None:
        while not self._stop.wait(self.poll_s):
            if daemon_running(self.paths):
                continue
            log.warning("rollbox daemon for %s is gone; restarting it", self.paths.home)
            self._ready.clear()
            with self._lock:
                self._generation += 1
                self._restarts += 1
            try:
                self._start_daemon()
                self._terminate_pool_sandboxes()
            except errors.RollboxError as e:
                log.error("restarting the rollbox daemon for %s failed: %s", self.paths.home, e)
                continue  # try again on the next poll; attempts meanwhile fail as infra errors
            self._ready.set()

    def _terminate_pool_sandboxes(self) -> None:
        """Ends every sandbox of the pools this actor served (open or closed since): after a
        restart they belong to lost episodes."""
        with self._lock:
            pool_ids = set(self._served)
        for info in self._client.request("GET", "/sandboxes"):
            if info.get("tags", {}).get("rollbox.pool") in pool_ids:
                try:
                    self._client.request("DELETE", f"/sandboxes/{info['sandbox_id']}")
                except errors.RollboxError:
                    pass

    def info(self) -> NodeInfo:
        return NodeInfo(self.node_id, socket.gethostname(), str(self.paths.home), self._daemon_pid(),
                        self._restarts, float(self.resources.get("CPU", 0.0)), float(self.resources.get("GPU", 0.0)),
                        os.getpid())

    def shutdown(self, stop: bool = False) -> None:
        """Closes this actor's pools and stops supervising; `stop=True` also stops the daemon
        (its sandboxes keep running, as with `rollbox daemon stop`)."""
        self._stop.set()
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        if stop:
            stop_daemon(self.paths)

    # ---- snapshots and images ------------------------------------------------------------------

    def missing(self, items: list[transfer.Item]) -> list[transfer.Item]:
        """The items this node lacks (what the driver must send)."""
        return transfer.missing(self.paths, items)

    def import_item(self, item: transfer.Item, data: bytes | str) -> bool:
        """Installs one packed item (bytes from the object store, or a path to a tar in a
        shared directory). Returns False when the node already had it."""
        return transfer.unpack(self.paths, item, Path(data) if isinstance(data, str) else data)

    # ---- episodes -----------------------------------------------------------------------------

    def open_pool(self, pool_id: str, snapshot_id: str, max_concurrency: int, keep_warm_seconds: float | None,
                  warm: int, warm_idle_seconds: float, isolation: str = "sandbox", runtime: str = "gvisor") -> None:
        """Prepares a node-local SandboxPool for the driver's pool `pool_id` (idempotent);
        isolation, runtime: the driver's pool's ("sandbox" or "container"; "gvisor" or "runc")."""
        with self._lock:
            if pool_id in self._pools:
                return
            pool = SandboxPool(snapshot_id, max_concurrency, keep_warm_seconds=keep_warm_seconds, warm=warm if isolation != "container" else 0,
                               warm_idle_seconds=warm_idle_seconds, client=self._client, backend="local",
                               isolation=isolation, runtime=runtime)
            pool.pool_id = pool_id  # the driver's id: its sandboxes carry it as their tag
            self._pools[pool_id] = pool
            self._served.add(pool_id)
        pool.start_warm()

    def close_pool(self, pool_id: str) -> None:
        """Waits for the pool's teardowns, then ends its sandboxes still alive."""
        with self._lock:
            pool = self._pools.pop(pool_id, None)
        if pool is not None:
            pool.close()

    def terminate_live(self, pool_id: str) -> None:
        """Ends the pool's sandboxes now (an aborted map): their episodes fail at once."""
        with self._lock:
            pool = self._pools.get(pool_id)
        if pool is not None:
            pool.terminate_live()

    def attempt(self, pool_id: str, fn_pickled: bytes, task: Any, timeout: float | None) -> Attempt:
        """Runs one episode attempt on a fresh sandbox of this node.

        Args:
            fn_pickled: the episode function, cloudpickled by the driver.
            timeout: seconds for the episode (restore excluded); None: no limit.

        Raises:
            SnapshotNotFound, InvalidArgument: as the local pool does (not retryable).
        """
        if not self._ready.wait(DAEMON_START_TIMEOUT_S):
            return Attempt("infra_error", None, f"DaemonUnavailable: the rollbox daemon on node {self.node_id} "
                           "is restarting", None, None, True, self.node_id)
        with self._lock:
            pool = self._pools.get(pool_id)
            gen = self._generation
        if pool is None:
            # This actor restarted (Ray re-ran __init__) since the driver opened the pool here:
            # not the episode's fault, and the driver reopens the pool and sends it again.
            return Attempt("infra_error", None, f"{POOL_NOT_OPEN}: pool {pool_id} is not open on node "
                           f"{self.node_id} (its rollbox actor restarted)", None, None, True, self.node_id)
        fn = cloudpickle.loads(fn_pickled)
        status, value, err, sandbox_id, ttfc, retryable = pool.attempt(fn, task, timeout)
        with self._lock:
            restarted = gen != self._generation
        if restarted and status != "ok":
            status, value, retryable = "infra_error", None, True
            err = f"DaemonUnavailable: the rollbox daemon on node {self.node_id} died during the episode ({err})"
        return Attempt(status, value, err, sandbox_id, ttfc, retryable, self.node_id)

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Removes a snapshot this node holds (an internal one, e.g. `@function.map`'s)."""
        try:
            self._client.request("DELETE", f"/snapshots/{snapshot_id}")
        except errors.NotFound:
            pass

    def call_function(self, payload: bytes, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`Function.remote(*args, **kwargs)` on this node's daemon; raises what it raises."""
        if not self._ready.wait(DAEMON_START_TIMEOUT_S):
            raise errors.DaemonUnavailable(f"the rollbox daemon on node {self.node_id} is restarting")
        fn: Function[Any] = cloudpickle.loads(payload)
        # On this node's daemon, never through a backend again.
        return Function(fn.fn, replace(fn.spec, backend=LOCAL), self._client).remote(*args, **kwargs)

    def ping(self) -> float:
        return time.time()
