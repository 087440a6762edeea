"""HTTP routes of the daemon (FastAPI; the OpenAPI schema is served at /openapi.json).

`create_app(service)` builds the app with no global state. Every rollbox error becomes
`{"code", "message", "sandbox_id"}` with its HTTP status, which the SDK maps back to the type.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from .. import errors
from ..config import DEFAULT_PLATFORM, check_platform
from ..version import __version__
from . import autopause
from .answers import JSONResponse, TypedServerErrors, add_error_handlers
from .episode_routes import add_episode_routes
from .file_routes import add_file_routes
from .fastpath import ExecFastPath
from .leases import Leases, add_lease_routes
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .process_routes import add_process_routes
from .service import SandboxService


class VolumeMount(BaseModel):
    name: str = Field(description="volume name, created on first use")
    mount_path: str = Field(description="absolute path in the sandbox, e.g. /data")
    read_only: StrictBool = Field(False, description="mount it read-only; a read-write mount is refused "
                                  "(volume_busy) beside another read-write one when either sandbox is gVisor")
    shared_writes: StrictBool = Field(False, description="share it read-write with other shared_writes mounts "
                                      "(gVisor cannot keep concurrent writes to ONE file intact: each writer "
                                      "should write its own files)")


AUTO_PAUSE_DOC = ("idle seconds (no call, no command, little CPU) before the sandbox is paused to disk; the next "
                  "call resumes it. null: the daemon's ROLLBOX_AUTO_PAUSE_SECONDS (unset: never); 0: never")


class CreateSandbox(BaseModel):
    image_id: str = Field(description="image to boot, e.g. 'im-debian-bookworm'")
    cpu: float = Field(1.0, description="CPU cores (float)", allow_inf_nan=False)
    memory: int = Field(1024, description="memory limit of the whole sandbox, MiB")
    env: dict[str, str] = Field(default_factory=dict)
    keep_warm_seconds: float | None = Field(600, description="idle seconds before the sandbox is killed; None or <=0: never",
                                           allow_inf_nan=False)
    volumes: list[VolumeMount] = Field(default_factory=list)
    tags: dict[str, str] = Field(default_factory=dict, description="labels for usage accounting")
    ports: list[StrictInt] = Field(default_factory=list, description="TCP ports in the sandbox to expose on the host")
    block_network: StrictBool = Field(True, description="block all outbound traffic (the default)")
    allow_list: list[StrictStr] | None = Field(None, description="with block_network=false: the only CIDRs and host "
                                               "names the sandbox may reach; null: anywhere")
    entrypoint: bool | None = Field(None, description="start the image's Entrypoint+Cmd as the main process; "
                                    "null: when the image declares an Entrypoint")
    gpu: str | None = Field(None, description="'any' or a GPU model ('H100', 'A100', ...): NVIDIA GPUs via nvproxy")
    gpu_count: int = Field(1, ge=1, le=16)
    docker_enabled: bool = Field(False, description="run a Docker daemon inside (image needs docker.io)")
    disk: StrictInt | None = Field(None, description="cap on the sandbox's writable layer, MiB (writes past it fail "
                                   "with ENOSPC inside); null: no cap")
    runtime: StrictStr = Field("gvisor", description="'gvisor' (default) or 'runc' (weaker isolation: the host "
                               "kernel, namespaces + seccomp; no memory snapshots)")
    pids: StrictInt = Field(512, description="the most processes and threads the sandbox may hold at once; a fork "
                            "past it fails with EAGAIN inside")
    auto_pause_seconds: float | None = Field(None, allow_inf_nan=False, description=AUTO_PAUSE_DOC)
    platform: StrictStr | None = Field(None, description="gVisor platform: 'systrap' or 'ptrace'; null: the "
                                       "daemon's (ROLLBOX_PLATFORM). Its snapshots restore on it")


class BuildImage(BaseModel):
    base: dict[str, Any] = Field(default_factory=dict, description=(
        "{'image_id': ID} | {'registry': REF, 'credentials': [user, password] | null, 'insecure': bool} | "
        "{'docker_archive': PATH} | {'oci_layout': PATH, 'ref': NAME | null}; {} is the Debian base"))
    steps: list[dict[str, Any]] = Field(default_factory=list, description="build steps (see rollbox.server.builder)")


class ExposePort(BaseModel):
    port: StrictInt = Field(description="TCP port in the sandbox, 1..65535")


class NetworkPermissions(BaseModel):
    block_network: StrictBool = True
    allow_list: list[StrictStr] | None = None


class RestoreSnapshot(BaseModel):
    keep_warm_seconds: float | None = Field(600, allow_inf_nan=False)
    tags: dict[str, str] = Field(default_factory=dict)
    auto_pause_seconds: float | None = Field(None, allow_inf_nan=False, description=AUTO_PAUSE_DOC)
    platform: StrictStr | None = Field(None, description="null, or the snapshot's own gVisor platform: a "
                                       "checkpoint restores only on the platform it was taken on")


class SnapshotRequest(BaseModel):
    ttl: float | None = Field(None, description="seconds before the store deletes it; None keeps it",
                              allow_inf_nan=False)


class WarmRequest(BaseModel):
    count: int = Field(ge=0, le=64, description="spares to keep restored; 0 removes the pool")
    idle_seconds: float = Field(300.0, gt=0, allow_inf_nan=False, description="unused this long: drain to zero")


class UpdateSandbox(BaseModel):
    keep_warm_seconds: float | None = Field(description="idle seconds before expiry; None or <= 0: never",
                                            allow_inf_nan=False)


class VolumeWrite(BaseModel):
    path: str
    data: str = Field(description="base64 bytes")


class ExecRequest(BaseModel):
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    stdin: str | None = Field(None, description="base64 bytes for stdin; None closes stdin at once")
    timeout: float | None = Field(None, description="seconds; None = no limit", gt=0, allow_inf_nan=False)
    max_output: int | None = Field(None, description="bytes kept per stream (<= 64 MiB); the rest is dropped "
                                   "(truncated=true)", ge=0, le=64 * 1024 * 1024)
    user: StrictStr | StrictInt | None = Field(None, description="user name or uid of the image to run as; "
                                              "null: the image's User")


class WriteFile(BaseModel):
    path: str
    data: str = Field(description="base64 bytes")
    mode: int = 0o644


class PathRequest(BaseModel):
    path: str


class ForkRequest(BaseModel):
    count: int = Field(ge=1, le=1024)
    keep_warm_seconds: float | None = Field(600, allow_inf_nan=False)


def create_app(service: SandboxService) -> FastAPI:
    app = FastAPI(title="rollbox daemon", version=__version__, default_response_class=JSONResponse)
    app.state.service = service

    add_error_handlers(app)
    app.state.stopping = False  # set by the daemon when a signal tells it to stop
    # Added first, so it runs inside TypedServerErrors (Starlette: the last added is outermost).
    app.add_middleware(ExecFastPath, service=service, model=ExecRequest)
    app.add_middleware(TypedServerErrors, stopping=lambda: bool(app.state.stopping))
    add_episode_routes(app, service, ExecRequest, WriteFile, PathRequest)
    add_lease_routes(app, Leases(service))
    add_file_routes(app, service)
    add_process_routes(app, service)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        import os
        return {"ok": True, "version": __version__, "pid": os.getpid(), "sandboxes": len(service.live),
                "platform": getattr(service.runsc, "platform", None), "network": service.net.stats()}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format: sandboxes by state, starts, start/exec latency, warm pools."""
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.post("/sandboxes")
    async def create(body: CreateSandbox) -> dict[str, Any]:
        if body.image_id == "im-debian-bookworm":
            await asyncio.to_thread(service.images.ensure_debian)
        auto_pause = autopause.resolve(body.auto_pause_seconds)
        info = await service.create(image_id=body.image_id, cpu=body.cpu, memory_mib=body.memory, env=body.env,
                                    keep_warm_seconds=body.keep_warm_seconds,
                                    volumes=[v.model_dump() for v in body.volumes], tags=body.tags,
                                    ports=body.ports, block_network=body.block_network, allow_list=body.allow_list,
                                    entrypoint=body.entrypoint, gpu=body.gpu, gpu_count=body.gpu_count,
                                    disk_mib=body.disk, pids=body.pids,
                                    docker_enabled=body.docker_enabled, runtime=body.runtime, platform=body.platform)
        if auto_pause is not None:
            service.autopause.arm(info.sandbox_id, auto_pause)
        return asdict(info)

    @app.post("/sandboxes/{sandbox_id}/ports")
    async def expose_port(sandbox_id: str, body: ExposePort) -> dict[str, Any]:
        return {"port": body.port, "url": await service.expose_port(sandbox_id, body.port)}

    @app.get("/sandboxes/{sandbox_id}/ports")
    async def list_urls(sandbox_id: str) -> dict[str, str]:
        return {str(p): u for p, u in service.list_urls(sandbox_id).items()}

    @app.put("/sandboxes/{sandbox_id}/network")
    async def update_network(sandbox_id: str, body: NetworkPermissions) -> dict[str, Any]:
        return asdict(await service.update_network_permissions(sandbox_id, body.block_network, body.allow_list))

    @app.get("/sandboxes")
    async def list_sandboxes(all: bool = False) -> list[dict[str, Any]]:  # noqa: A002 - query name
        return [asdict(i) for i in service.list_sandboxes(all)]

    @app.get("/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str) -> dict[str, Any]:
        return asdict(service.info(sandbox_id))

    @app.patch("/sandboxes/{sandbox_id}")
    async def update(sandbox_id: str, body: UpdateSandbox) -> dict[str, Any]:
        return asdict(service.update_ttl(sandbox_id, body.keep_warm_seconds))

    @app.post("/sandboxes/{sandbox_id}/pause")
    async def pause(sandbox_id: str) -> dict[str, Any]:
        return {"snapshot_id": await service.pause(sandbox_id)}

    @app.post("/sandboxes/{sandbox_id}/resume")
    async def resume(sandbox_id: str) -> dict[str, Any]:
        return asdict(await service.resume(sandbox_id))

    @app.get("/sandboxes/{sandbox_id}/usage")
    async def sandbox_usage(sandbox_id: str) -> dict[str, Any]:
        service.info(sandbox_id)
        if sandbox_id in service.live:
            service.sample_usage()
        rows = service.store.usage(sandbox_id)
        return rows[0] if rows else {}

    @app.delete("/sandboxes/{sandbox_id}")
    async def terminate(sandbox_id: str) -> dict[str, Any]:
        return asdict(await service.terminate(sandbox_id))

    @app.post("/sandboxes/{sandbox_id}/exec")
    async def exec_(sandbox_id: str, body: ExecRequest) -> dict[str, Any]:
        return await service.exec(sandbox_id, body.argv, env=body.env, cwd=body.cwd, stdin=body.stdin,
                                  timeout=body.timeout, max_output=body.max_output, user=body.user)

    @app.post("/sandboxes/{sandbox_id}/files/write")
    async def write_file(sandbox_id: str, body: WriteFile) -> dict[str, Any]:
        return await service.write_file(sandbox_id, body.path, body.data, body.mode)

    @app.post("/sandboxes/{sandbox_id}/files/read")
    async def read_file(sandbox_id: str, body: PathRequest) -> dict[str, Any]:
        return await service.read_file(sandbox_id, body.path)

    @app.post("/sandboxes/{sandbox_id}/files/list")
    async def list_files(sandbox_id: str, body: PathRequest) -> dict[str, Any]:
        return await service.list_files(sandbox_id, body.path)

    @app.post("/sandboxes/{sandbox_id}/files/remove")
    async def remove_file(sandbox_id: str, body: PathRequest) -> dict[str, Any]:
        return await service.remove_file(sandbox_id, body.path)

    @app.post("/sandboxes/{sandbox_id}/snapshot")
    async def snapshot(sandbox_id: str, body: SnapshotRequest | None = None) -> dict[str, Any]:
        return {"snapshot_id": await service.snapshot_memory(sandbox_id, ttl_s=body.ttl if body else None)}

    @app.post("/sandboxes/{sandbox_id}/fork")
    async def fork(sandbox_id: str, body: ForkRequest) -> list[dict[str, Any]]:
        out = await service.fork(sandbox_id, body.count, body.keep_warm_seconds)
        return [{"sandbox": asdict(o["sandbox"])} if "sandbox" in o else o for o in out]

    @app.post("/sandboxes/{sandbox_id}/image")
    async def image_from_fs(sandbox_id: str) -> dict[str, Any]:
        return {"image_id": await service.create_image_from_filesystem(sandbox_id)}

    @app.post("/snapshots/{snapshot_id}/restore")
    async def restore(snapshot_id: str, body: RestoreSnapshot) -> dict[str, Any]:
        auto_pause = autopause.resolve(body.auto_pause_seconds)
        if body.platform is not None:
            taken_on = service.snapshots.meta(snapshot_id).platform or DEFAULT_PLATFORM  # SnapshotNotFound first
            if check_platform(body.platform) != taken_on:
                raise errors.InvalidArgument(
                    f"platform={body.platform!r}: snapshot {snapshot_id} was taken on gVisor platform {taken_on!r} "
                    f"and restores only there; leave platform=None (or pass {taken_on!r})")
        info = await service.acquire(snapshot_id, keep_warm_seconds=body.keep_warm_seconds, tags=body.tags)
        if auto_pause is not None:
            service.autopause.arm(info.sandbox_id, auto_pause)
        return asdict(info)

    @app.put("/snapshots/{snapshot_id}/warm")
    async def set_warm(snapshot_id: str, body: WarmRequest) -> dict[str, Any]:
        return await service.warm.set_and_settle(snapshot_id, body.count, body.idle_seconds)

    @app.get("/snapshots/{snapshot_id}/warm")
    async def get_warm(snapshot_id: str) -> dict[str, Any]:
        return service.warm.status(snapshot_id)

    @app.get("/snapshots")
    async def list_snapshots() -> list[dict[str, Any]]:
        return service.list_snapshots()

    @app.delete("/snapshots/{snapshot_id}")
    async def delete_snapshot(snapshot_id: str) -> dict[str, Any]:
        await service.delete_snapshot(snapshot_id)
        return {"deleted": snapshot_id}

    @app.post("/images/debian")
    async def ensure_debian() -> dict[str, Any]:
        return {"image_id": await asyncio.to_thread(service.images.ensure_debian)}

    @app.get("/images")
    async def list_images() -> list[dict[str, Any]]:
        return await asyncio.to_thread(service.images.sizes)

    @app.post("/images/build")
    async def build_image(body: BuildImage) -> dict[str, Any]:
        return await service.build_image(body.base, body.steps)

    @app.post("/images/prune")
    async def prune_images() -> dict[str, Any]:
        return await asyncio.to_thread(service.images.prune)

    @app.get("/images/{image_id}")
    async def get_image(image_id: str) -> dict[str, Any]:
        return asdict(service.images.meta(image_id))

    @app.delete("/images/{image_id}")
    async def delete_image(image_id: str) -> dict[str, Any]:
        await asyncio.to_thread(service.delete_image, image_id)
        return {"deleted": image_id}

    @app.get("/usage")
    async def usage() -> list[dict[str, Any]]:
        service.sample_usage()
        return service.store.usage()

    @app.get("/volumes")
    async def list_volumes() -> list[dict[str, Any]]:
        return [asdict(v) for v in await asyncio.to_thread(service.volumes.list)]

    @app.put("/volumes/{name}")
    async def create_volume(name: str) -> dict[str, Any]:
        service.volumes.ensure(name)
        return asdict(service.volumes.info(name))

    @app.get("/volumes/{name}")
    async def get_volume(name: str) -> dict[str, Any]:
        return asdict(await asyncio.to_thread(service.volumes.info, name))

    @app.delete("/volumes/{name}")
    async def delete_volume(name: str) -> dict[str, Any]:
        await asyncio.to_thread(service.delete_volume, name)
        return {"deleted": name}

    @app.post("/volumes/{name}/files/write")
    async def volume_write(name: str, body: VolumeWrite) -> dict[str, Any]:
        try:
            data = base64.b64decode(body.data, validate=True)
        except ValueError:  # binascii.Error too
            raise errors.InvalidArgument("data must be base64 (RFC 4648, standard alphabet)") from None
        return {"size": await asyncio.to_thread(service.volumes.write_file, name, body.path, data)}

    @app.post("/volumes/{name}/files/read")
    async def volume_read(name: str, body: PathRequest) -> dict[str, Any]:
        data = await asyncio.to_thread(service.volumes.read_file, name, body.path)
        return {"data": base64.b64encode(data).decode()}

    @app.post("/volumes/{name}/files/list")
    async def volume_list(name: str, body: PathRequest) -> dict[str, Any]:
        return {"entries": await asyncio.to_thread(service.volumes.list_files, name, body.path)}

    @app.post("/volumes/{name}/files/remove")
    async def volume_remove(name: str, body: PathRequest) -> dict[str, Any]:
        await asyncio.to_thread(service.volumes.remove_file, name, body.path)
        return {}

    return app
