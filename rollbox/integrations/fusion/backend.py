"""The rollbox side of `rollbox serve-fusion`: one warm snapshot, one long-lived SandboxPool.

Start-up (`FusionBackend.start`): build the image (cached after the first time), boot one
sandbox, copy the helper programs in, find which toolchains the image has, start python3 and
compile a hello-world per compiled language (page cache, Go's build cache), snapshot its
memory; then open `SandboxPool(snapshot, isolation=...)` and run each language's hello-world
through it, offering only the languages whose hello-world printed what it should.

Requests: each one is `pool.submit(job, episode_fn)`, awaited with `asyncio.wrap_future`, so
the pool's `max_concurrency` is the server's concurrency and further requests queue. Every
request runs in a fresh episode (a fresh container by default, a fresh gVisor sandbox with
isolation="sandbox"), retried once on a fresh one after an infrastructure fault. If the
daemon restarted and forgot the episode pool, the pool is replaced and the request retried.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from rollbox.config import check_platform
from rollbox.errors import InvalidArgument, InvalidState, RollboxError
from rollbox.sdk.image import Image
from rollbox.sdk.pool import SandboxPool
from rollbox.sdk.sandbox import Sandbox
from rollbox.types import EpisodeResult
from rollbox.sdk.pool import ISOLATIONS

from . import languages as langs
from .images import build_image
from .episodes import (BadRequest, CodeJob, JupyterJob, code_response, decode_files, jupyter_episode, jupyter_response,
                       run_code_episode, sandbox_error)
from .models import RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse, RunStatus

SCRIPTS = ("limited.py", "kernel.py")
WARM_IMPORTS = "import json, math, re, collections, itertools, functools, heapq, bisect, string, random, typing"
SETUP_TIMEOUT_S = 300.0


def say(line: str) -> None:
    """Start-up progress to stdout, flushed: a log file or pipe shows each line as it happens."""
    print(line, flush=True)


def _script(name: str) -> bytes:
    return (resources.files(__package__) / "sandbox_scripts" / name).read_bytes()


def prepare_snapshot(image: Image, *, memory_mib: int, cpu: float,
                     log: Callable[[str], None], platform: str | None = None) -> tuple[str, dict[str, str]]:
    """Boots one sandbox of `image` on gVisor `platform` (None: the daemon's), readies it
    (helper programs, toolchains probed and warmed, python3 started) and snapshots its memory.
    Returns (snapshot id, {language: why it is not installed, "" when it is})."""
    sb = Sandbox(image=image, cpu=cpu, memory=memory_mib, keep_warm_seconds=600, platform=platform).create()
    try:
        sb.exec("mkdir", "-p", langs.WORKDIR, langs.SCRIPTS_DIR, langs.TOOL_ENV["GOCACHE"], timeout=60)
        for name in SCRIPTS:
            sb.fs.write_file(f"{langs.SCRIPTS_DIR}/{name}", _script(name))
        found = langs.installed(sb.exec(*langs.probe_command(), timeout=60).stdout.decode())
        log("  toolchains found for: " + ", ".join(n for n, why in found.items() if not why))
        if found["python"]:
            raise InvalidArgument(f"the image cannot serve SandboxFusion requests: {found['python']} (python3 "
                                  "runs the helper programs and Python code)")
        sb.exec("python3", "-c", WARM_IMPORTS, timeout=60)
        for lang in langs.LANGUAGES.values():
            if lang.compile is None or found[lang.name]:
                continue
            log(f"  warming {lang.name} ({' '.join(lang.compile)})")
            warm = f"/tmp/rollbox-warm-{lang.name}"
            sb.fs.write_file(f"{warm}/{lang.source}", lang.hello)
            r = sb.exec(*lang.compile, timeout=SETUP_TIMEOUT_S, cwd=warm, env=lang.compiler_env())
            if r.exit_code != 0:
                found[lang.name] = f"its hello-world did not compile: {r.stderr[-300:].decode(errors='replace')}"
            sb.exec("rm", "-rf", warm, timeout=60)
        return sb.snapshot_memory(), found
    finally:
        sb.terminate()


class FusionBackend:
    """The warm snapshot, the episode pool and the language table behind the HTTP API.

    Args:
        image: what every episode runs in (it needs python3).
        isolation: "container" (default: a fresh container per request inside pooled gVisor
            sandboxes, the fastest mode) or "sandbox" (a fresh gVisor sandbox per request).
        concurrency: requests running at once (the pool's max_concurrency); more queue.
        runtime: container isolation's pooled sandboxes: "gvisor" (default) or "runc" (on the
            host kernel: several times faster, weaker; SandboxPool's `runtime`).
        memory_mib: memory limit of each sandbox in MiB; a container's address space is
            capped at it too.
        cpu: CPU cores of each sandbox.
        log: where start-up progress goes.
        platform: the gVisor platform of the snapshot and so of every sandbox restored from it
            ("systrap" or "ptrace"; None: the daemon's). ptrace makes Python requests cheaper
            (each is a fork of a warm interpreter) and compilers' file-heavy work dearer
            (Sandbox's `platform`, README "gVisor platform"). Ignored on runc.

    `start()` before serving, `close()` after (it closes the pool and deletes the snapshot).
    Thread-safe; the `run_*` coroutines run on the server's event loop.
    """

    def __init__(self, image: Image, *, isolation: str = "container", concurrency: int = 8,
                 memory_mib: int = 1024, cpu: float = 1.0, log: Callable[[str], None] = say,
                 runtime: str = "gvisor", platform: str | None = None) -> None:
        if isolation not in ISOLATIONS:
            raise InvalidArgument(f"isolation={isolation!r} must be one of {', '.join(ISOLATIONS)}")
        if runtime not in ("gvisor", "runc") or (runtime == "runc" and isolation != "container"):
            raise InvalidArgument(f"runtime={runtime!r} must be 'gvisor', or 'runc' with isolation='container'")
        self.runtime = runtime
        self.platform = check_platform(platform)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency={concurrency!r} must be an int >= 1")
        self.image = image
        self.isolation = isolation
        self.concurrency = concurrency
        self.memory_mib = memory_mib
        self.cpu = cpu
        self.log = log
        self.snapshot_id: str | None = None
        self.pool: SandboxPool | None = None
        self.why_not: dict[str, str] = {}  # language -> why it is not offered ("" when it is)
        self._lock = threading.Lock()

    @property
    def available(self) -> list[str]:
        return [name for name, why in self.why_not.items() if not why]

    def start(self) -> None:
        """Builds the image, prepares the snapshot, opens the pool, checks every language."""
        self.log(f"rollbox serve-fusion: preparing {'the image and ' if self.image.needs_build else ''}"
                 f"a warm snapshot ({self.memory_mib} MiB, {self.cpu:g} CPU per sandbox) ...")
        image = build_image(self.image, self.log)
        self.snapshot_id, self.why_not = prepare_snapshot(image, memory_mib=self.memory_mib, cpu=self.cpu,
                                                          log=self.log, platform=self.platform)
        self.pool = self._new_pool()
        self._self_test()
        if self.why_not["python"]:
            raise InvalidArgument(f"Python does not run in episodes of this image: {self.why_not['python']}")
        where = f"{self.runtime} ({self.platform})" if self.platform and self.runtime == "gvisor" else self.runtime
        self.log(f"  snapshot {self.snapshot_id}; isolation {self.isolation} on {where}, "
                 f"concurrency {self.concurrency}; "
                 f"languages: {', '.join(self.available)}")
        for name, why in self.why_not.items():
            if why:
                self.log(f"  not offered: {name} ({why})")

    def _new_pool(self) -> SandboxPool:
        assert self.snapshot_id is not None
        warm = self.concurrency if self.isolation == "sandbox" else 0
        return SandboxPool(self.snapshot_id, max_concurrency=self.concurrency, warm=warm, isolation=self.isolation,
                           runtime=self.runtime)

    def _self_test(self) -> None:
        """Runs each installed language's hello-world as a request; a language whose run
        fails (e.g. a runtime that cannot start under the container's limits) is not offered."""
        assert self.pool is not None
        jobs = {name: self._code_job(langs.LANGUAGES[name], langs.LANGUAGES[name].hello, timeout=60.0)
                for name, why in self.why_not.items() if not why}
        futs = {name: self.pool.submit(job, run_code_episode, timeout=job.episode_timeout, retries=1)
                for name, job in jobs.items()}
        for name, fut in futs.items():
            resp = code_response(jobs[name], fut.result())
            out = resp.run_result.stdout if resp.run_result else ""
            if resp.status != RunStatus.Success or langs.LANGUAGES[name].hello_prints not in (out or ""):
                detail = resp.message or (resp.run_result or resp.compile_result or resp).model_dump_json()[:300]
                self.why_not[name] = f"its hello-world failed at start-up: {resp.status.value}: {detail}"

    @staticmethod
    def _code_job(lang: langs.Language, code: str, *, timeout: float = 10.0) -> CodeJob:
        return CodeJob(language=lang, code=code.encode(), files={}, fetch=[], stdin=None, compile_timeout=timeout,
                       run_timeout=timeout, memory_limit_mib=-1)

    async def _submit(self, job: Any, fn: Callable[[Any, Any], None], timeout: float) -> EpisodeResult:
        for attempt in range(2):
            pool = self.pool
            if pool is None:
                raise InvalidState("the server is not started or is shutting down")
            res = await asyncio.wrap_future(pool.submit(job, fn, timeout=timeout, retries=1))
            if attempt == 0 and res.status == "infra_error" and "EpisodePoolNotFound" in (res.error or ""):
                self._renew(pool)  # the daemon restarted: its episode pools are gone, the snapshot is not
                continue
            return res
        return res

    def _renew(self, stale: SandboxPool) -> None:
        with self._lock:
            if self.pool is not stale:
                return
            self.pool = self._new_pool()
        threading.Thread(target=stale.close, daemon=True, name="fusion-pool-close").start()

    async def run_code(self, req: RunCodeRequest) -> RunCodeResponse:
        """Runs one `/run_code` request in a fresh episode."""
        lang = langs.LANGUAGES.get(req.language)
        if lang is None or self.why_not.get(req.language):
            return sandbox_error(langs.unavailable_message(req.language, self.available, self.why_not))
        try:
            job = CodeJob(language=lang, code=req.code.encode(), files=decode_files(req.files),
                          fetch=list(req.fetch_files), stdin=None if req.stdin is None else req.stdin.encode(),
                          compile_timeout=req.compile_timeout, run_timeout=req.run_timeout,
                          memory_limit_mib=req.memory_limit_MB)
        except BadRequest as e:
            return sandbox_error(str(e))
        try:
            res = await self._submit(job, run_code_episode, job.episode_timeout)
        except RollboxError as e:
            return sandbox_error(f"the request could not be run: {type(e).__name__}: {e}")
        return code_response(job, res)

    async def run_jupyter(self, req: RunJupyterRequest) -> RunJupyterResponse:
        """Runs one `/run_jupyter` request: every cell in order in one python3 process, in a
        fresh episode."""
        if req.kernel != "python3":
            return RunJupyterResponse(status=RunStatus.SandboxError,
                                      message=f"kernel {req.kernel!r} is not supported: only 'python3'")
        try:
            job = JupyterJob(cells=list(req.cells), cell_timeout=req.cell_timeout, total_timeout=req.total_timeout,
                             memory_limit_mib=req.memory_limit_MB, files=decode_files(req.files),
                             fetch=list(req.fetch_files))
        except BadRequest as e:
            return RunJupyterResponse(status=RunStatus.SandboxError, message=str(e))
        try:
            res = await self._submit(job, jupyter_episode, job.episode_timeout)
        except RollboxError as e:
            return RunJupyterResponse(status=RunStatus.SandboxError,
                                      message=f"the request could not be run: {type(e).__name__}: {e}")
        return jupyter_response(job, res)

    def close(self) -> None:
        """Closes the pool (waiting for episodes in flight) and deletes the snapshot."""
        with self._lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
        if self.snapshot_id is not None:
            from rollbox.sdk.sandbox import default_client  # no public call deletes a snapshot
            try:
                default_client().request("DELETE", f"/snapshots/{self.snapshot_id}")
            except RollboxError:
                pass
            self.snapshot_id = None


def default_concurrency() -> int:
    """Four requests per core (a pooled sandbox runs two containers at once), at most 64."""
    return max(2, min(64, 4 * (os.cpu_count() or 1)))

