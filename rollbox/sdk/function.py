"""`@function`: run a Python function in a fresh sandbox, with one argument or over many.

    @function(cpu=1.0, memory=512, volumes=[Volume("ckpt", "/ckpt")])
    def train_step(batch): ...

    train_step.remote(batch)          # one call, one fresh sandbox
    list(train_step.map(batches))     # fan-out; results in input order
    train_step(batch)                 # a plain local call

The function, its arguments and its result travel by cloudpickle; cloudpickle's own source
is copied into the sandbox, so the image needs only python3 (of the same minor version as
the caller, since code objects are pickled). `.map()` prepares one sandbox with the function
loaded, snapshots its memory, and runs every input in a fresh sandbox restored from it.

The result is unpickled in the caller: run your own code here. Untrusted code (what a policy
wrote) belongs in `Sandbox.exec`, whose results are plain bytes.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import cloudpickle

from .. import errors
from ..client.default import default_client
from ..client.transport import Client
from ._aio import threaded, threaded_stream
from .backends import LOCAL, get_backend, resolve_backend
from .image import Image
from .pool import SandboxPool, check_pool_modes
from .sandbox import Sandbox, SandboxInstance
from .volume import Volume

R = TypeVar("R")
WORKDIR = "/tmp/rollbox-fn"
RUNNER = f"""
import sys, traceback
sys.path.insert(0, {WORKDIR!r} + "/pkgs")
import cloudpickle
job = sys.argv[1]
with open({WORKDIR!r} + "/fn.pkl", "rb") as f:
    fn = cloudpickle.load(f)
with open(job + ".in", "rb") as f:
    args, kwargs = cloudpickle.load(f)
try:
    out = (True, fn(*args, **kwargs), "")
except BaseException as e:
    tb = traceback.format_exc()
    try:
        exc = cloudpickle.dumps(e)
    except Exception:
        exc = None
    out = (False, exc, "%s: %s" % (type(e).__name__, e), tb)
try:
    data = cloudpickle.dumps(out)
except Exception as e:
    data = cloudpickle.dumps((False, None, "the result could not be pickled: %r" % e, traceback.format_exc()))
with open(job + ".out", "wb") as f:
    f.write(data)
"""
VERSION_CHECK = "import sys; print('%d.%d' % sys.version_info[:2])"


class FunctionError(errors.RollboxError):
    """The remote function raised an exception that could not be brought back as itself (its
    class does not unpickle here); `.remote_traceback` has the remote traceback text."""

    code = "function_error"
    status = 500

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


@dataclass(frozen=True)
class FunctionSpec:
    image: Image = field(default_factory=Image.debian)
    cpu: float = 1.0
    memory: int = 1024
    volumes: tuple[Volume, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = 600.0
    retries: int = 1
    gpu: str | None = None
    gpu_count: int = 1
    backend: str | None = None  # "local" | "ray"; None: rollbox.init() decides


class FunctionCall(Generic[R]):
    """A call started by `.spawn()`: `get(timeout=None)` waits for its value (or raises what
    `.remote()` would), `done()` says whether it finished."""

    def __init__(self, fut: "cf.Future[R]") -> None:
        self._fut = fut

    def get(self, timeout: float | None = None) -> R:
        return self._fut.result(timeout)

    def done(self) -> bool:
        return self._fut.done()


def _cloudpickle_files() -> list[tuple[str, bytes]]:
    pkg = Path(cloudpickle.__file__).parent
    return [(f"cloudpickle/{p.name}", p.read_bytes()) for p in sorted(pkg.glob("*.py"))]


class Function(Generic[R]):
    """A function that runs in sandboxes; made by `@function`."""

    def __init__(self, fn: Callable[..., R], spec: FunctionSpec, client: Client | None = None) -> None:
        self.fn = fn
        self.spec = spec
        self._client = client
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    def _sandbox(self) -> Sandbox:
        s = self.spec
        return Sandbox(image=s.image, cpu=s.cpu, memory=s.memory, volumes=list(s.volumes), env=s.env,
                       keep_warm_seconds=max(600.0, (s.timeout or 0) + 60), client=self._client,
                       tags={"rollbox.function": getattr(self.fn, "__qualname__", "function")},
                       gpu=s.gpu, gpu_count=s.gpu_count)

    def _check_python(self, sb: SandboxInstance) -> None:
        """Code objects pickle per minor version: refuse a mismatch clearly, not with a crash."""
        here = "%d.%d" % sys.version_info[:2]
        r = sb.exec("python3", "-c", VERSION_CHECK, timeout=60)
        there = r.text().strip()
        if r.exit_code != 0:
            raise errors.InvalidArgument(f"the function's image has no working python3 ({r.stderr_text()[-300:]}); "
                                         f"it needs Python {here}, like the caller")
        if there != here:
            raise errors.InvalidArgument(f"the function's image has Python {there} but this caller runs {here}: "
                                         f"cloudpickled code needs the same minor version; use an image with "
                                         f"Python {here} (e.g. Image.from_registry('python:{here}-slim'))")

    def _load(self, sb: SandboxInstance) -> None:
        self._check_python(sb)
        for rel, data in _cloudpickle_files():
            sb.fs.write_file(f"{WORKDIR}/pkgs/{rel}", data)
        sb.fs.write_file(f"{WORKDIR}/runner.py", RUNNER.encode())
        sb.fs.write_file(f"{WORKDIR}/fn.pkl", self._pickled_fn())

    def _pickled_fn(self) -> bytes:
        """The function by value, with its module's globals: that module is not importable
        in the sandbox (cloudpickle would otherwise pickle it by reference)."""
        mod = sys.modules.get(getattr(self.fn, "__module__", "") or "")
        if mod is None or mod.__name__ == "__main__":
            return bytes(cloudpickle.dumps(self.fn))
        cloudpickle.register_pickle_by_value(mod)
        try:
            return bytes(cloudpickle.dumps(self.fn))
        finally:
            cloudpickle.unregister_pickle_by_value(mod)

    def _run(self, sb: SandboxInstance, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        job = f"{WORKDIR}/job-{secrets.token_hex(6)}"
        sb.fs.write_file(job + ".in", cloudpickle.dumps((args, kwargs)))
        r = sb.exec("python3", f"{WORKDIR}/runner.py", job, timeout=self.spec.timeout)
        if r.timed_out:
            sb.terminate()  # what the function started dies with its sandbox
            raise errors.FunctionTimeout(f"function {self.fn.__qualname__} ran past its timeout "
                                         f"({self.spec.timeout} s); its sandbox was killed", sandbox_id=sb.sandbox_id)
        if r.oom_killed:
            raise errors.ResourceExhausted(f"function {self.fn.__qualname__} ran out of memory "
                                           f"({self.spec.memory} MiB); raise memory=", sandbox_id=sb.sandbox_id)
        try:
            out = cloudpickle.loads(sb.fs.read_file(job + ".out"))
        except errors.FileNotFoundInSandbox:
            raise FunctionError(f"function {self.fn.__qualname__} died without a result (exit {r.exit_code}): "
                                f"{r.stderr_text()[-1500:]}") from None
        except errors.InvalidArgument as e:
            raise FunctionError(f"function {self.fn.__qualname__} returned a result too large to bring back "
                                f"({e}); write big outputs to a Volume and return their path") from None
        if out[0]:
            return out[1]  # type: ignore[no-any-return]
        _ok, pickled, summary, tb = out
        exc: BaseException | None = None
        if pickled is not None:
            try:
                exc = cloudpickle.loads(pickled)
            except Exception:  # noqa: BLE001 - its class does not exist here
                exc = None
        if isinstance(exc, Exception):
            # The remote exception itself, so `except ValueError:` works; the traceback text
            # from the sandbox rides along as a note and an attribute.
            exc.add_note(f"remote traceback (function {self.fn.__qualname__} in sandbox {sb.sandbox_id}):\n{tb}")
            try:
                exc.remote_traceback = tb  # type: ignore[attr-defined]
            except AttributeError:
                pass
            raise exc
        raise FunctionError(f"function {self.fn.__qualname__} raised {summary}", tb)

    @threaded
    def remote(self, *args: Any, **kwargs: Any) -> R:
        """Runs one call in a fresh sandbox and returns its result.

        Raises:
            The function's own exception (same type, with `.remote_traceback` and a note holding
            the remote traceback), or FunctionError when its class cannot be unpickled here.
            FunctionTimeout: it ran past `timeout` (its sandbox was killed). ResourceExhausted:
            out of memory. ResourceUnavailable: `gpu=` on a machine without one.
        """
        name = resolve_backend(self.spec.backend)
        if name != LOCAL:
            return get_backend(name).call_function(self, args, kwargs)  # type: ignore[no-any-return]
        return self._remote_local(*args, **kwargs)

    def _remote_local(self, *args: Any, **kwargs: Any) -> R:
        with self._sandbox().create() as sb:
            self._load(sb)
            return self._run(sb, args, kwargs)

    def spawn(self, *args: Any, **kwargs: Any) -> FunctionCall[R]:
        """Starts `.remote(*args)` in the background; returns a handle (`.get()`)."""
        ex = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollbox-spawn")
        fut = ex.submit(self.remote, *args, **kwargs)
        ex.shutdown(wait=False)
        return FunctionCall(fut)

    def local(self, *args: Any, **kwargs: Any) -> R:
        """Runs the function here, in this process (no sandbox)."""
        return self.fn(*args, **kwargs)

    @threaded_stream
    def map(self, inputs: Iterable[Any], *, max_concurrency: int = 4, return_exceptions: bool = False,
            isolation: str = "sandbox", runtime: str = "gvisor") -> Iterator[R | BaseException]:
        """Calls the function once per input (one argument each), each in a fresh sandbox
        restored from one prepared snapshot; yields results in input order.

        isolation: "sandbox" (a fresh gVisor sandbox per call) or "container" (a fresh
        container per call inside pooled sandboxes: SandboxPool's `isolation`; several times
        faster for short calls; no GPU, volumes or network inside the containers).
        runtime: container mode only: "gvisor" (default) or "runc" (the containers run on the
        host kernel in pooled runc sandboxes, as SandboxPool's `runtime`; the README's threat
        model says what that shares). InvalidArgument for runtime="runc" with
        isolation="sandbox", before anything is started.

        With `return_exceptions=True` a failed call yields its exception in its slot;
        otherwise the first failure is raised.
        """
        check_pool_modes(isolation, runtime)
        items = list(inputs)
        if not items:
            return
        prep = self._sandbox().create()
        try:
            self._load(prep)
            snap = prep.snapshot_memory()
        finally:
            prep.terminate()
        client = self._client
        pool: SandboxPool | None = None
        try:
            with SandboxPool(snap, max_concurrency=max_concurrency, client=client, backend=self.spec.backend,
                             isolation=isolation, runtime=runtime) as pool:
                def call(sb: SandboxInstance, x: Any) -> Any:
                    try:
                        return {"ok": True, "v": self._run(sb, (x,), {})}
                    except errors.RollboxError as e:
                        if isinstance(e, (errors.SandboxLost, errors.DaemonUnavailable)):
                            raise  # a platform fault: the pool retries it on a fresh sandbox
                        return {"ok": False, "e": e}
                    except Exception as e:  # noqa: BLE001 - the function's own exception
                        return {"ok": False, "e": e}
                for res in pool.map(call, items, timeout=None if self.spec.timeout is None else self.spec.timeout + 60,
                                    retries=self.spec.retries, ordered=True, progress=False):
                    if res.status == "ok" and res.value["ok"]:
                        yield res.value["v"]
                        continue
                    err: BaseException
                    if res.status == "ok":
                        err = res.value["e"]
                    elif res.status == "timeout":
                        err = errors.FunctionTimeout(f"call {res.index} of {self.fn.__qualname__} ran past its "
                                                     f"timeout ({self.spec.timeout} s); its sandbox was killed")
                    else:
                        err = errors.RollboxError(f"call {res.index} ended with status {res.status}: {res.error}")
                    if not return_exceptions:
                        raise err
                    yield err
        finally:
            if pool is not None and pool._remote is not None:
                pool._remote.delete_snapshot(snap)  # the copies shipped to the Ray nodes
            try:
                (client or _default()).request("DELETE", f"/snapshots/{snap}")
            except errors.RollboxError:
                pass


def _default() -> Client:
    return default_client()


def function(fn: Callable[..., R] | None = None, *, image: Image | None = None, cpu: float = 1.0,
             memory: int = 1024, volumes: Iterable[Volume] = (), env: dict[str, str] | None = None,
             timeout: float | None = 600.0, retries: int = 1, gpu: str | None = None, gpu_count: int = 1,
             client: Client | None = None, backend: str | None = None) -> Any:
    """Decorator: `@function` or `@function(cpu=2.0, memory=2048, volumes=[...], timeout=60)`.

    Args:
        image: the sandbox image (default Image.debian()). cpu: cores. memory: MiB.
        volumes: Volume list mounted in every call's sandbox. env: environment variables.
        timeout: seconds per call (None: no limit). retries: extra attempts after a platform fault
            (in `.map()`).
        gpu: None, "any", or a model ("H100", "A100", "L4", ...): each call's sandbox gets
            `gpu_count` NVIDIA GPUs through gVisor's nvproxy. On a machine without a matching
            GPU the call raises ResourceUnavailable (never a silent CPU run).
        backend: "local" (this machine) or "ray" (calls run on the nodes of a Ray cluster:
            `.remote` on one node, `.map` over all, from a snapshot prepared here and shipped
            once per node); None: "ray" after `rollbox.init()`, else "local".
    """
    if timeout is not None and timeout <= 0:
        raise errors.InvalidArgument(f"timeout={timeout} must be a positive number of seconds or None")
    spec = FunctionSpec(image or Image.debian(), cpu, memory, tuple(volumes), dict(env or {}), timeout, retries,
                        gpu, gpu_count, resolve_backend(backend) if backend is not None else None)

    def wrap(f: Callable[..., R]) -> Function[R]:
        return Function(f, spec, client)

    return wrap(fn) if fn is not None else wrap
