"""The Ray backend: episodes of a `SandboxPool` (and calls of a `@function`) scheduled over a
Ray cluster, one rollbox daemon per node.

Per pool, on first use: connect to Ray, get or create the `NodeDaemon` actor of every alive
node (one per node and driver, pinned with `NodeAffinitySchedulingStrategy`, `num_cpus=0`
so it never takes a CPU from the work Ray places), ship the snapshot and the image it needs
to the nodes that lack them (`transfer.py`: packed once, through the object store or a shared
directory, skipped by nodes that have them), and open a node-local pool on each.

Then the driver keeps at most `max_concurrency` attempts in flight, each on the node with the
fewest in flight per declared CPU. An attempt that ends in a retryable `infra_error` (the
node's daemon died, the sandbox was lost, the node itself went away) is sent again, to
another node when there is one, up to `retries` times: the same contract as the local pool,
whose classification code the nodes run.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import cloudpickle

from .. import errors
from ..config import Paths
from ..sdk.backends import EpisodeFn, PoolSpec
from ..sdk.pool import reward_of
from ..types import EpisodeResult
from . import transfer
from .node import POOL_NOT_OPEN, Attempt, NodeDaemon, NodeInfo

if TYPE_CHECKING:
    from ..sdk.function import Function

log = logging.getLogger("rollbox.distributed")
ACTOR_MAX_CONCURRENCY = 1000  # threads of a node actor: episodes in flight there, plus control calls
NODE_PENALTY_S = 5.0  # a node that just had an infrastructure fault is avoided this long
CONTROL_TIMEOUT_S = 120.0
# An attempt with a per-episode timeout that has not answered this long past it is given up as
# an infrastructure fault (a hung or partitioned node that Ray has not declared dead): its
# queue wait for a start slot on the node and its teardown fit well inside.
ATTEMPT_GRACE_S = 300.0
WAIT_TICK_S = 1.0  # how often the driver looks for overdue attempts
# The node actor handles this process created, by node id, kept and reused for the life of the
# process: Ray ends a (non-detached) actor once its creator's handle is dropped (a handle got
# again by name does not keep it), and the node's daemon with it (Ray kills a dead worker's
# child processes), so the end of a pool must not end its nodes' actors. (A SandboxPool and its
# RayPool used to hold each other, so their handles lived until the garbage collector happened
# to run: the actors and daemons died at a random moment after each pool.)
_node_handles: dict[str, Any] = {}


@dataclass(frozen=True)
class RayConfig:
    """How the Ray backend connects. `address`: passed to `ray.init` (None: the cluster in
    RAY_ADDRESS or a local one); `transfer_dir`: a directory every node can read (e.g. NFS)
    through which snapshots and images travel instead of Ray's object store."""

    address: str | None = None
    transfer_dir: Path | None = None


def require_ray() -> ModuleType:
    """Imports ray. Raises RuntimeMissing (with the install command) when it is absent."""
    try:
        import ray
    except ImportError:
        raise errors.RuntimeMissing("the Ray backend needs Ray: pip install 'rollbox[ray]'") from None
    return ray


def connect(config: RayConfig) -> ModuleType:
    """Connects this process to Ray once (a no-op when already connected); returns the module."""
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=config.address, logging_level=logging.WARNING, log_to_driver=False,
                 configure_logging=False)
    return ray


def pickle_by_value(obj: Any, module: str | None) -> bytes:
    """cloudpickle `obj`, carrying `module`'s code by value: a node may not be able to import
    the caller's module (a test file, a notebook, a script)."""
    mod = sys.modules.get(module or "")
    if mod is None or mod.__name__ == "__main__" or mod.__name__.startswith("rollbox."):
        return bytes(cloudpickle.dumps(obj))
    cloudpickle.register_pickle_by_value(mod)
    try:
        return bytes(cloudpickle.dumps(obj))
    finally:
        cloudpickle.unregister_pickle_by_value(mod)


class Cluster:
    """This driver's view of the node actors: handles, what each reported, and what was sent."""

    def __init__(self, config: RayConfig) -> None:
        self.config = config
        self.ray = connect(config)
        self.actors: dict[str, Any] = {}
        self.info: dict[str, NodeInfo] = {}
        self.sent: dict[str, list[transfer.Item]] = {}  # node id -> items shipped to it by this driver
        self.refresh()

    def refresh(self) -> None:
        """(Re)discovers alive nodes and gets or creates one NodeDaemon actor on each.

        Raises:
            DaemonUnavailable: no node could start a rollbox daemon (the first failure quoted).
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_cls = self.ray.remote(NodeDaemon)

        def make(n: dict[str, Any]) -> Any:
            nid = n["NodeID"]
            return actor_cls.options(
                name=f"rollbox-node-{nid}", get_if_exists=True, num_cpus=0, max_restarts=-1,
                max_concurrency=ACTOR_MAX_CONCURRENCY,
                scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
            ).remote(None, nid, {k: float(v) for k, v in n.get("Resources", {}).items()})

        new = {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] not in self.actors}
        failures = []
        for nid, node in new.items():
            kept = _node_handles.get(nid)
            # A kept handle may belong to an earlier Ray session (ray.shutdown, init again):
            # then it fails, and a new actor is made.
            for h in ([kept] if kept is not None else []) + [None]:
                try:
                    if h is None:
                        h = _node_handles[nid] = make(node)
                    self.info[nid] = self.ray.get(h.info.remote(), timeout=CONTROL_TIMEOUT_S + 60)
                    self.actors[nid] = h
                    break
                except Exception as e:  # noqa: BLE001 - one node failing must not stop the others
                    if kept is not None and h is kept:
                        continue
                    log.warning("node %s cannot run rollbox: %s", nid, e)
                    failures.append(f"{nid[:12]}: {e}")
        if not self.actors:
            raise errors.DaemonUnavailable("no Ray node could start a rollbox daemon (each node needs root, runsc "
                                           "and rollbox installed): " + "; ".join(failures)[:1500])

    def drop(self, nid: str) -> None:
        self.actors.pop(nid, None)
        self.info.pop(nid, None)

    def ship_snapshot(self, paths: Paths, snapshot_id: str) -> None:
        """Makes `snapshot_id` (and its image chain) present on every node, each item packed at
        most once and sent only to the nodes that lack it.

        Raises:
            SnapshotNotFound: neither this machine (`paths`) nor some node has it.
        """
        ray = self.ray
        nodes = list(self.actors)
        try:
            items = transfer.items_for_snapshot(paths, snapshot_id)
        except errors.SnapshotNotFound:
            items = [transfer.Item("snapshot", snapshot_id)]  # maybe the nodes have it already
            lacking = ray.get([self.actors[n].missing.remote(items) for n in nodes], timeout=CONTROL_TIMEOUT_S)
            if any(lacking):
                raise errors.SnapshotNotFound(f"snapshot {snapshot_id!r} is neither on this machine ({paths.home}) "
                                              "nor on every Ray node: make it here, then map") from None
            return
        lacking = ray.get([self.actors[n].missing.remote(items) for n in nodes], timeout=CONTROL_TIMEOUT_S)
        packed: dict[transfer.Item, Any] = {}
        calls = []
        for nid, need in zip(nodes, lacking):
            for item in need:
                if item not in packed:
                    packed[item] = self._pack(paths, item)
                calls.append(self.actors[nid].import_item.remote(item, packed[item]))
                self.sent.setdefault(nid, []).append(item)
        ray.get(calls, timeout=CONTROL_TIMEOUT_S * 5)

    def _pack(self, paths: Paths, item: transfer.Item) -> Any:
        if self.config.transfer_dir is None:
            return self.ray.put(transfer.pack(paths, item))
        d = self.config.transfer_dir
        d.mkdir(parents=True, exist_ok=True)
        dest = d / f"{item.kind}-{item.key}.tar"
        if not dest.is_file():  # content-addressed: an earlier run's copy is this one
            transfer.pack(paths, item, dest)
        return str(dest)


class RayPool:
    """The Ray side of one `SandboxPool(..., backend="ray")` (a `rollbox.sdk.backends.PoolBackend`);
    built from the pool's `PoolSpec` and driven by the pool."""

    def __init__(self, pool: PoolSpec, config: RayConfig) -> None:
        self.pool = pool
        self.config = config
        self.cluster: Cluster | None = None
        self._opened: set[str] = set()
        self._aborted = False

    def _setup(self) -> Cluster:
        if self.cluster is None:
            self.cluster = Cluster(self.config)
        c = self.cluster
        c.ship_snapshot(self.pool.client.paths, self.pool.snapshot_id)
        self._open_on(c, [n for n in c.actors if n not in self._opened])
        return c

    def _open_on(self, c: Cluster, nodes: list[str]) -> None:
        p = self.pool
        refs = [c.actors[n].open_pool.remote(p.pool_id, p.snapshot_id, p.max_concurrency, p.keep_warm_seconds,
                                             p.warm, p.warm_idle_seconds, p.isolation, p.runtime)
                for n in nodes]
        c.ray.get(refs, timeout=CONTROL_TIMEOUT_S)
        self._opened.update(nodes)

    def _pick(self, c: Cluster, load: dict[str, int], avoid: set[str], penalty: dict[str, float]) -> str | None:
        nodes = [n for n in c.actors if n in self._opened]
        if not nodes:
            return None
        now = time.monotonic()
        pref = [n for n in nodes if n not in avoid and penalty.get(n, 0.0) <= now]
        pref = pref or [n for n in nodes if n not in avoid] or nodes
        return min(pref, key=lambda n: (load.get(n, 0) / max(c.info[n].cpu, 1.0), load.get(n, 0)))

    def map(self, fn: EpisodeFn, tasks: Iterable[Any], *, timeout: float | None, retries: int,
            ordered: bool, progress: bool | None) -> Iterator[EpisodeResult]:
        """`SandboxPool.map` over the cluster; same arguments, results and errors."""
        items = list(tasks)
        if retries < 0:
            raise errors.InvalidArgument(f"retries={retries} must be >= 0")
        c = self._setup()
        ray = c.ray
        fn_ref = ray.put(pickle_by_value(fn, getattr(fn, "__module__", None)))
        queue: collections.deque[tuple[int, list[Attempt]]] = collections.deque((i, []) for i in range(len(items)))
        started: dict[int, float] = {}
        inflight: dict[Any, tuple[int, str, list[Attempt]]] = {}
        give_up: dict[Any, float] = {}  # ref -> monotonic time past which it counts as lost
        reopened: dict[str, int] = collections.Counter()
        load: dict[str, int] = collections.Counter()
        penalty: dict[str, float] = {}
        done_in_order: dict[int, EpisodeResult] = {}
        next_i = 0
        try:
            while queue or inflight:
                while queue and len(inflight) < self.pool.max_concurrency:
                    idx, hist = queue.popleft()
                    avoid = {a.node for a in hist if a.status == "infra_error"}
                    nid = self._pick(c, load, avoid, penalty)
                    if nid is None:
                        raise errors.DaemonUnavailable("every Ray node of this pool was lost")
                    started.setdefault(idx, time.monotonic())
                    ref = c.actors[nid].attempt.remote(self.pool.pool_id, fn_ref, items[idx], timeout)
                    inflight[ref] = (idx, nid, hist)
                    give_up[ref] = (time.monotonic() + timeout + ATTEMPT_GRACE_S) if timeout else float("inf")
                    load[nid] += 1
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=WAIT_TICK_S)
                now = time.monotonic()
                overdue = [r for r in inflight if r not in ready and give_up[r] < now]
                for ref in [*ready, *overdue]:
                    idx, nid, hist = inflight.pop(ref)
                    give_up.pop(ref)
                    load[nid] -= 1
                    if ref in overdue:
                        with contextlib.suppress(Exception):
                            ray.cancel(ref)  # best effort: a hung actor may never see it
                        penalty[nid] = now + ATTEMPT_GRACE_S  # and new episodes avoid it as long
                        log.warning("node %s: an attempt outlived its timeout by %.0f s; retrying it elsewhere",
                                    nid, ATTEMPT_GRACE_S)
                        a = Attempt("infra_error", None, f"the Ray node {nid} did not answer within {timeout:.0f} s "
                                    f"(the episode's timeout) + {ATTEMPT_GRACE_S:.0f} s: hung or unreachable",
                                    None, None, True, nid)
                    else:
                        a = self._collect(c, ref, nid)
                        if a.status == "infra_error" and (a.error or "").startswith(POOL_NOT_OPEN) \
                                and reopened[nid] < 3:
                            # The node's actor restarted and forgot the pool: open it again and
                            # resend; the episode never ran, so this is not one of its attempts.
                            reopened[nid] += 1
                            self._opened.discard(nid)
                            self._open_on(c, [nid])
                            queue.appendleft((idx, hist))
                            continue
                    hist.append(a)
                    if a.status == "infra_error" and a.retryable and len(hist) <= retries and not self._aborted:
                        penalty[nid] = max(penalty.get(nid, 0.0), time.monotonic() + NODE_PENALTY_S)
                        queue.appendleft((idx, hist))
                        continue
                    res = self._result(idx, hist, started[idx])
                    if not ordered:
                        yield res
                        continue
                    done_in_order[idx] = res
                    while next_i in done_in_order:
                        yield done_in_order.pop(next_i)
                        next_i += 1
        except BaseException:
            # Stopped early: end the sandboxes of attempts in flight so they return at once.
            self._aborted = True
            self._broadcast("terminate_live")
            raise

    @staticmethod
    def _collect(c: Any, ref: Any, nid: str) -> Attempt:
        """A finished attempt's outcome; a dead actor is an infrastructure fault (node dropped),
        a RollboxError the node raised (bad snapshot id, ...) is raised here."""
        from ray.exceptions import RayActorError, RayTaskError
        try:
            a: Attempt = c.ray.get(ref)
            return a
        except RayTaskError as e:
            if isinstance(e.cause, errors.RollboxError):
                raise e.cause from None
            raise
        except RayActorError as e:
            log.warning("node %s lost: %s", nid, e)
            c.drop(nid)
            return Attempt("infra_error", None, f"the Ray node {nid} (or its rollbox actor) died: "
                           f"{type(e).__name__}", None, None, True, nid)

    @staticmethod
    def _result(idx: int, hist: list[Attempt], start: float) -> EpisodeResult:
        a = hist[-1]
        if a.status == "ok":
            reward = reward_of(a.value)
        elif a.status == "infra_error":
            reward = None
        else:
            reward = 0.0
        extra: dict[str, Any] = {}
        if len(hist) > 1:
            extra["attempts"] = [{"node": h.node, "sandbox_id": h.sandbox_id, "status": h.status, "error": h.error}
                                 for h in hist]
        return EpisodeResult(index=idx, status=a.status, value=a.value if a.status == "ok" else None,  # type: ignore[arg-type]
                             reward=reward, attempts=len(hist), sandbox_id=a.sandbox_id,
                             wall_s=time.monotonic() - start, error=a.error, ttfc_ms=a.ttfc_ms, extra=extra, node=a.node)

    def _broadcast(self, method: str) -> None:
        c = self.cluster
        if c is None:
            return
        refs = [getattr(c.actors[n], method).remote(self.pool.pool_id) for n in self._opened if n in c.actors]
        try:
            c.ray.get(refs, timeout=CONTROL_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - best effort: a lost node has no sandboxes to end
            log.warning("%s on the nodes: %s", method, e)

    def close(self) -> None:
        """Closes the pool on every node: waits for teardowns, ends its sandboxes still alive."""
        self._broadcast("close_pool")
        self._opened.clear()

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Removes `snapshot_id` from every node that holds it (for internal snapshots)."""
        c = self.cluster
        if c is None:
            return
        refs = [h.delete_snapshot.remote(snapshot_id) for h in c.actors.values()]
        try:
            c.ray.get(refs, timeout=CONTROL_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001
            log.warning("deleting snapshot %s on the nodes: %s", snapshot_id, e)


def call_function(config: RayConfig, fn: "Function[Any]", args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`Function.remote` on one alive node of the cluster, chosen at random among those with
    the GPUs the function asks for (declared to Ray).

    Raises what `Function.remote` raises, as itself.
    """
    import random

    c = Cluster(config)
    ray = c.ray
    from ray.exceptions import RayTaskError

    eligible = [n for n, i in c.info.items() if not fn.spec.gpu or i.gpu >= fn.spec.gpu_count] or list(c.actors)
    nid = random.choice(eligible)
    from dataclasses import replace

    from ..sdk.function import Function

    # No client (a connection to this machine's daemon means nothing there), never Ray again.
    payload = pickle_by_value(Function(fn.fn, replace(fn.spec, backend="local")), getattr(fn.fn, "__module__", None))
    try:
        return ray.get(c.actors[nid].call_function.remote(payload, args, kwargs))
    except RayTaskError as e:
        if isinstance(e.cause, BaseException):
            raise e.cause from None
        raise
