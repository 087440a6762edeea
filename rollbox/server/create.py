"""Creating a sandbox from an image: the create options (the image's config, volumes, GPUs,
Docker inside, the image's entrypoint) are checked and applied around one boot."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

from .. import errors
from ..network.policy import NetworkSpec
from ..config import check_platform
from ..runtime.bundle import DEFAULT_PIDS
from ..runtime.driver import check_runtime
from ..runtime.gpu import select as select_gpus
from ..types import SandboxInfo
from ..volumes.store import check_mount_path, check_name
from .boot import Booter
from .context import ServiceContext
from .execfiles import ExecFiles
from .teardown import Teardown
from .validation import new_sandbox_id


class Creator:
    def __init__(self, ctx: ServiceContext, booter: Booter, execfiles: ExecFiles, teardown: Teardown) -> None:
        self.ctx = ctx
        self.booter = booter
        self.execfiles = execfiles
        self.teardown = teardown

    async def create(self, *, image_id: str, cpu: float = 1.0, memory_mib: int = 1024,
                     env: dict[str, str] | None = None, keep_warm_seconds: float | None = 600,
                     volumes: list[dict[str, Any]] | None = None, tags: dict[str, str] | None = None,
                     ports: list[int] | None = None, block_network: bool = True,
                     allow_list: list[str] | None = None, entrypoint: bool | None = None,
                     gpu: str | None = None, gpu_count: int = 1, docker_enabled: bool = False,
                     disk_mib: int | None = None, runtime: str = "gvisor", pids: int = DEFAULT_PIDS,
                     platform: str | None = None) -> SandboxInfo:
        """A fresh sandbox of `image_id`. The image's config applies: its Env under `env`, its
        WorkingDir and User for commands, and its Entrypoint + Cmd started as the main process
        when `entrypoint` is True, or None and the image declares one. `platform`: its gVisor
        platform (config.PLATFORMS; None: the daemon's), kept by its snapshots.

        Raises:
            InvalidArgument: an option is invalid or cannot apply (e.g. no Docker in the image).
            VolumeBusy: a read-write volume mount beside another sandbox's (volumes/writers.py).
            RuntimeMissing: the runtime is not installed.
            ImageNotFound: no such image.
            ResourceUnavailable: no matching GPU.
        """
        net = NetworkSpec.parse(ports, block_network, allow_list)  # validated before anything exists
        check_runtime(runtime)
        check_platform(platform)
        if runtime == "runc" and platform is not None:
            raise errors.InvalidArgument(f"platform={platform!r} is a gVisor platform; runtime='runc' has none "
                                         f"(leave platform=None)")
        if runtime == "runc" and (gpu is not None or docker_enabled):
            raise errors.InvalidArgument("runtime='runc' supports neither gpu= nor docker_enabled=True (both need "
                                         "gVisor's nvproxy or its own kernel); use runtime='gvisor'")
        self.ctx.drivers[runtime].check()  # RuntimeMissing with the install hint
        cfg = self.ctx.images.meta(image_id).image_config  # raises ImageNotFound
        main = [*(cfg.entrypoint or []), *(cfg.cmd or [])] if (entrypoint or (entrypoint is None and cfg.entrypoint)) else []
        if entrypoint and not main:
            raise errors.InvalidArgument(f"image {image_id} declares no Entrypoint or Cmd to start")
        env = {**cfg.env_dict(), **(env or {})}
        if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
            raise errors.InvalidArgument(f"gpu={gpu!r} must be 'any' or a GPU model such as 'H100', or None")
        gpus = select_gpus(gpu, gpu_count) if gpu else []  # ResourceUnavailable without one
        if gpus:
            env.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(str(g.index) for g in gpus))
        vols: list[dict[str, Any]] = []
        seen: set[str] = set()
        for v in volumes or []:
            mp = check_mount_path(v.get("mount_path", ""))
            if mp in seen:
                raise errors.InvalidArgument(f"two volumes are mounted at {mp}; give each its own mount_path")
            seen.add(mp)
            vols.append({"name": check_name(v.get("name", "")), "mount_path": mp, "read_only": bool(v.get("read_only")),
                         "shared_writes": bool(v.get("shared_writes"))})
        info = await self.booter.boot(sandbox_id=new_sandbox_id(), image_id=image_id, cpu=cpu, memory_mib=memory_mib,
                                      env=env, keep_warm_seconds=keep_warm_seconds, volumes=vols, tags=tags, net=net,
                                      gpus=gpus, privileged=docker_enabled, disk_mib=disk_mib, runtime=runtime,
                                      pids=pids, platform=platform)
        if docker_enabled:
            # gVisor's documented Docker-in-gVisor set-up: no bridge or iptables (containers use
            # the sandbox's network), the vfs storage driver (no overlayfs inside).
            # The data root on the sandbox's /tmp (a bounded tmpfs here): on the gofer-backed root, `docker
            # run` failed with "bad file descriptor" creating the container's layer.
            try:
                await self.execfiles.agent(info.sandbox_id, "spawn",
                                           argv=["dockerd", "--iptables=false", "--ip6tables=false",
                                                 "--bridge=none", "--storage-driver=vfs", "--data-root=/tmp/docker"],
                                           env={}, log="/var/log/rollbox-dockerd.log")
            except errors.InvalidArgument as e:
                await self.teardown.terminate(info.sandbox_id, reason="docker did not start")
                raise errors.InvalidArgument(f"docker_enabled: {e}; the image needs Docker, e.g. "
                                             "Image.debian().apt_install('docker.io')", sandbox_id=info.sandbox_id) from None
            await self._wait_docker(info.sandbox_id)
        if main:
            try:
                await self.execfiles.agent(info.sandbox_id, "spawn", argv=main, env={}, cwd=cfg.working_dir,
                                           user=cfg.user, log="/tmp/.rollbox-entrypoint.log")
            except errors.RollboxError:
                await self.teardown.terminate(info.sandbox_id, reason="entrypoint failed")
                raise
        return info

    async def _wait_docker(self, sandbox_id: str, wait_s: float = 60.0) -> None:
        """Waits until the sandbox's Docker daemon answers; terminates the sandbox and raises
        InvalidArgument when the image has no Docker or it does not come up."""
        deadline = time.monotonic() + wait_s
        last = ""
        while time.monotonic() < deadline:
            r = await self.execfiles.exec(sandbox_id, ["docker", "version", "--format", "{{.Server.Version}}"],
                                          timeout=20)
            if r.get("exit_code") == 0:
                return
            last = base64.b64decode(r.get("stderr") or "").decode(errors="replace")[-300:]
            if r.get("exit_code") == 127:
                break
            await asyncio.sleep(0.3)
        await self.teardown.terminate(sandbox_id, reason="docker did not start")
        raise errors.InvalidArgument(f"docker_enabled: no Docker daemon came up in sandbox {sandbox_id} ({last.strip()}); "
                                     "the image needs Docker, e.g. Image.debian().apt_install('docker.io')",
                                     sandbox_id=sandbox_id)
