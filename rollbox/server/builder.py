"""The image builder: each step of an `Image` chain becomes one cached, content-addressed image.

A step's image id is a hash of its parent's id and the step itself (commands, environment,
file contents), so building an unchanged chain again does no work, changing one step rebuilds
only that step and those after it, and two chains with a common prefix share its images (each
is one overlay layer; nothing is copied per image or per sandbox).

Steps (the wire form the SDK sends):
    {"kind": "run", "commands": [sh command, ...]}      run in a sandbox with network access
    {"kind": "env", "env": {KEY: value}}                 image config only
    {"kind": "workdir", "path": "/app"}                  image config (and the directory)
    {"kind": "file", "path": "/app/x.py", "data": base64, "mode": 0o644}
    {"kind": "dir", "path": "/app", "tar": base64 of a tar of the directory's contents}

Run steps see the host's CA bundle (for TLS-intercepting proxies) through SSL_CERT_FILE and
friends, written to the sandbox's /tmp (a tmpfs, so it never lands in the layer). /etc/hosts,
/etc/resolv.conf and /etc/hostname, which rollbox manages at run time, are not kept in a layer
(as in Docker).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import logging
import os
import stat
import tarfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from .. import errors
from ..images.store import ImageConfig, ImageMeta
from ..runtime.rootfs import copy_tree, remove_tree

if TYPE_CHECKING:
    from .service import SandboxService

log = logging.getLogger("rollbox.builder")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
SANDBOX_CA = "/tmp/.rollbox-build-ca.pem"
STEP_TIMEOUT_S = 1800.0
BUILD_MEMORY_MIB = 2048
MANAGED_FILES = ("etc/hosts", "etc/resolv.conf", "etc/hostname")
KINDS = ("run", "env", "workdir", "file", "dir")


@dataclass(frozen=True)
class StepKind:
    """A step kind another module adds: its check, describe and build functions (build
    writes the step into the empty layer `rootfs` and returns the image's new config)."""

    check: Callable[[dict[str, Any]], dict[str, Any]]
    describe: Callable[[dict[str, Any]], str]
    build: Callable[["Builder", str, dict[str, Any], Path, ImageConfig], Awaitable[ImageConfig]]


# Filled by rollbox/server/dockerfile_steps.py (a Dockerfile's config, copy and copy_from).
EXTRA_KINDS: dict[str, StepKind] = {}


@dataclass(frozen=True)
class StepReport:
    step: str
    image_id: str
    cached: bool
    seconds: float


def check_step(step: dict[str, Any]) -> dict[str, Any]:
    """Validates one step's wire form; raises InvalidArgument naming what is wrong."""
    kind = step.get("kind")
    if isinstance(kind, str) and kind in EXTRA_KINDS:
        return EXTRA_KINDS[kind].check(step)
    if kind not in KINDS:
        raise errors.InvalidArgument(f"build step kind {kind!r} is not one of {', '.join([*KINDS, *EXTRA_KINDS])}")
    if kind == "run":
        cmds = step.get("commands")
        if not cmds or not all(isinstance(c, str) and c.strip() for c in cmds):
            raise errors.InvalidArgument("a run step needs a non-empty list of non-empty shell commands")
    elif kind == "env":
        env = step.get("env")
        if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k and "\0" not in k
                                                and isinstance(v, str) and "\0" not in v for k, v in env.items()):
            raise errors.InvalidArgument("an env step needs {NAME: value} strings (no '=' in names, no NUL bytes)")
    else:
        path = step.get("path")
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise errors.InvalidArgument(f"build step path {path!r} must be an absolute path in the image")
        if ".." in Path(path).parts:
            raise errors.InvalidArgument(f"build step path {path!r} must not contain '..'")
        if len(path) > 4000 or path.rstrip("/") == "":
            raise errors.InvalidArgument(f"build step path {path[:80]!r} must name something below / (< 4000 characters)")
        if kind == "file" and not isinstance(step.get("data"), str):
            raise errors.InvalidArgument("a file step needs base64 `data`")
        mode = step.get("mode", 0o644)
        if kind == "file" and (isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777):
            raise errors.InvalidArgument(f"file step mode {mode!r} must be an integer permission in 0..0o7777")
        if kind == "dir" and not isinstance(step.get("tar"), str):
            raise errors.InvalidArgument("a dir step needs a base64 `tar`")
    return step


def describe(step: dict[str, Any]) -> str:
    kind = step["kind"]
    if kind == "run":
        text = " && ".join(step["commands"])
    elif kind == "env":
        text = " ".join(f"{k}={v}" for k, v in step["env"].items())
    elif kind in EXTRA_KINDS:
        text = EXTRA_KINDS[kind].describe(step)
    else:
        text = step["path"]
    return f"{kind} {text[:100]}{'…' if len(text) > 100 else ''}"


def step_image_id(parent_id: str, step: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps({"parent": parent_id, "step": step}, sort_keys=True).encode()).hexdigest()
    return "im-" + digest[:24]


def _inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _no_symlink(root: Path, rel: str) -> Path | None:
    """root/rel when no component of it is a symlink (so an operation on it stays in the
    layer), else None."""
    p = root
    for part in Path(rel).parts:
        p = p / part
        if p.is_symlink():
            return None
    return p


def _lookup(lowers: list[Path], rel: str) -> Path | None:
    """The topmost layer's entry for `rel` (None when absent or whited out)."""
    for layer in lowers:
        p = layer / rel
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # an overlayfs whiteout
            return None
        return p
    return None


def resolve_in_image(lowers: list[Path], path: str) -> str:
    """`path` with the image's symlinked parent directories followed (Debian's /bin ->
    usr/bin, /lib -> usr/lib), as Docker does: writing /bin/tool into a layer must not create a
    real /bin that hides the image's. Links are resolved inside the image, never on the host."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise errors.InvalidArgument(f"build step path {path!r} names the root directory")
    out: list[str] = []
    hops = 0
    rest = parts[:-1]
    while rest:
        comp, rest = rest[0], rest[1:]
        if comp == "..":
            out = out[:-1]
            continue
        hit = _lookup(lowers, "/".join([*out, comp]))
        if hit is not None and hit.is_symlink():
            hops += 1
            if hops > 40:
                raise errors.InvalidArgument(f"build step path {path!r}: too many symbolic links in the image")
            target = os.readlink(hit)
            if target.startswith("/"):
                out = []
            rest = [p for p in target.split("/") if p not in ("", ".")] + rest
            continue
        out.append(comp)
    return "/" + "/".join([*out, parts[-1]])


def _write_file(root: Path, step: dict[str, Any]) -> None:
    dest = _inside(root, step["path"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = base64.b64decode(step["data"], validate=True)
    except ValueError:
        raise errors.InvalidArgument(f"file step {step['path']}: data is not base64") from None
    dest.write_bytes(data)
    os.chmod(dest, int(step.get("mode") or 0o644))


def _extract_dir(root: Path, step: dict[str, Any]) -> None:
    dest = _inside(root, step["path"])
    dest.mkdir(parents=True, exist_ok=True)
    try:
        raw = base64.b64decode(step["tar"], validate=True)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            # The "data" filter refuses absolute paths, '..', links out of the tree and devices.
            tf.extractall(dest, filter="data")
    except (ValueError, tarfile.TarError) as e:
        raise errors.InvalidArgument(f"dir step {step['path']}: bad tar ({e})") from None


class Builder:
    """Builds step chains on one SandboxService (whose sandboxes run the `run` steps)."""

    def __init__(self, svc: "SandboxService") -> None:
        self.svc = svc
        self._locks: dict[str, asyncio.Lock] = {}

    async def build(self, base_id: str, steps: list[dict[str, Any]]) -> tuple[str, list[StepReport]]:
        """Returns the chain's final image id and one report per step. Raises ImageNotFound
        (base), InvalidArgument (a malformed step), ImageBuildError (a failed command)."""
        for s in steps:
            check_step(s)
        self.svc.images.meta(base_id)
        parent, reports = base_id, []
        for step in steps:
            image_id = step_image_id(parent, step)
            t0 = time.monotonic()
            lock = self._locks.setdefault(image_id, asyncio.Lock())
            async with lock:  # the same step built by two clients at once: once
                cached = self.svc.images.exists(image_id)
                if not cached:
                    await self._build_step(parent, image_id, step)
            self._locks.pop(image_id, None)
            reports.append(StepReport(describe(step), image_id, cached, round(time.monotonic() - t0, 2)))
            parent = image_id
        return parent, reports

    async def _build_step(self, parent: str, image_id: str, step: dict[str, Any]) -> None:
        store = self.svc.images
        config = store.meta(parent).image_config
        staged = store.staging_dir("build")
        try:
            rootfs = staged / "rootfs"
            kind = step["kind"]
            if kind == "run":
                await self._run(parent, config, step, rootfs)
            else:
                rootfs.mkdir()
                if kind in ("workdir", "file", "dir"):
                    step = {**step, "path": resolve_in_image(store.layers(parent), step["path"])}
                if kind == "env":
                    env = {**config.env_dict(), **step["env"]}
                    config = replace(config, env=[f"{k}={v}" for k, v in env.items()])
                elif kind == "workdir":
                    _inside(rootfs, step["path"]).mkdir(parents=True, exist_ok=True)
                    config = replace(config, working_dir=step["path"])
                elif kind == "file":
                    await asyncio.to_thread(_write_file, rootfs, step)
                elif kind in EXTRA_KINDS:
                    config = await EXTRA_KINDS[kind].build(self, parent, step, rootfs, config)
                else:
                    await asyncio.to_thread(_extract_dir, rootfs, step)
            meta = ImageMeta(image_id, "build", parent, time.time(), config=asdict(config),
                             source="build: " + describe(step))
            await asyncio.to_thread(store.add_image, meta, rootfs)
        finally:
            await asyncio.to_thread(remove_tree, staged)

    async def _run(self, parent: str, config: ImageConfig, step: dict[str, Any], rootfs: Path) -> None:
        svc = self.svc
        info = await svc.create(image_id=parent, cpu=float(min(2, os.cpu_count() or 1)), memory_mib=BUILD_MEMORY_MIB,
                                keep_warm_seconds=STEP_TIMEOUT_S, block_network=False,
                                tags={"rollbox.build": parent})
        sid = info.sandbox_id
        try:
            env: dict[str, str] = {"DEBIAN_FRONTEND": "noninteractive", "PIP_BREAK_SYSTEM_PACKAGES": "1",
                                   "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            if HOST_CA.is_file():
                await svc.write_file(sid, SANDBOX_CA, base64.b64encode(HOST_CA.read_bytes()).decode(), 0o644)
                env.update({k: SANDBOX_CA for k in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE",
                                                     "CURL_CA_BUNDLE")})
            for cmd in step["commands"]:
                r = await svc.exec(sid, ["/bin/sh", "-c", cmd], env=env, timeout=STEP_TIMEOUT_S,
                                   cwd=config.working_dir)
                if r.get("timed_out") or r.get("exit_code") != 0:
                    out = base64.b64decode(r.get("stdout") or "") + base64.b64decode(r.get("stderr") or "")
                    why = "timed out" if r.get("timed_out") else f"exited {r.get('exit_code')}"
                    raise errors.ImageBuildError(f"build step `{cmd}` on {parent} {why}:\n"
                                          f"{out.decode(errors='replace')[-3000:]}")
            upper = svc.upper_dir(sid)
            await asyncio.to_thread(copy_tree, upper, rootfs)
            for rel in MANAGED_FILES:
                # Never through a symlink the step made (`ln -s /etc /etc` would point at the host's).
                p = _no_symlink(rootfs, rel)
                if p is not None and p.is_file():
                    p.unlink()
        finally:
            await svc.terminate(sid, reason="build step done")

