"""HTTP routes of episode pools and their containers (server/episodes.py).

    POST   /episode-pools                              open a pool over a snapshot
    GET    /episode-pools/{pool_id}                    its pooled sandboxes and counters
    PUT    /episode-pools/{pool_id}/heartbeat          renew its lease
    DELETE /episode-pools/{pool_id}                    close it (terminates its sandboxes)
    POST   /episode-pools/{pool_id}/containers         a fresh container for one episode (ending
                                                       the earlier ones listed in `end` first)
    DELETE /episode-pools/{pool_id}/containers/{cid}   end the episode (?status=ok|timeout|...)
    POST   /sandboxes/{sid}/containers/{cid}/exec      run a command in the container
    POST   /sandboxes/{sid}/containers/{cid}/files/{write,read,list,remove}
"""

# No `from __future__ import annotations`: FastAPI must see the request models passed in.
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from pydantic import BaseModel, Field, StrictStr

from .episodes import DEFAULT_EPISODES_PER_SANDBOX, EpisodePools

if TYPE_CHECKING:
    from .service import SandboxService


class OpenEpisodePool(BaseModel):
    snapshot_id: str
    max_concurrency: int = Field(16, ge=1, le=4096)
    sandboxes: int | None = Field(None, ge=1, le=4096, description="pooled sandboxes at most")
    episodes_per_sandbox: int = Field(DEFAULT_EPISODES_PER_SANDBOX, ge=1,
                                      description="episodes a pooled sandbox serves before a fresh restore")
    keep_warm_seconds: float | None = Field(600, allow_inf_nan=False)
    root_mib: int | None = Field(None, ge=8, description="MiB each container may write (memory-backed)")
    tags: dict[str, str] = Field(default_factory=dict)
    lease_s: float = Field(60.0, gt=0, allow_inf_nan=False,
                           description="seconds without a call or heartbeat before the daemon closes the pool")
    runtime: StrictStr = Field("gvisor", description="'gvisor' (pooled sandboxes restored from the snapshot) or "
                               "'runc' (pooled runc sandboxes booted with its files: host kernel, weaker isolation)")


class EndEpisode(BaseModel):
    container_id: str
    status: str = "ok"


class BeginEpisode(BaseModel):
    env: dict[str, str] = Field(default_factory=dict)
    end: list[EndEpisode] = Field(default_factory=list, max_length=4096,
                                  description="earlier episodes' containers to end first (one request fewer each)")


def add_episode_routes(app: FastAPI, service: "SandboxService", exec_model: type[BaseModel],
                       write_model: type[BaseModel], path_model: type[BaseModel]) -> EpisodePools:
    """Registers the routes on `app`; the request models of sandbox exec/files are reused so
    a container's calls validate exactly as a sandbox's."""
    pools = EpisodePools(service)
    app.state.episode_pools = pools

    @app.post("/episode-pools")
    async def open_pool(body: OpenEpisodePool) -> dict[str, Any]:
        return pools.open(body.snapshot_id, max_concurrency=body.max_concurrency, sandboxes=body.sandboxes,
                          episodes_per_sandbox=body.episodes_per_sandbox, keep_warm_seconds=body.keep_warm_seconds,
                          root_mib=body.root_mib, tags=body.tags, lease_s=body.lease_s, runtime=body.runtime)

    @app.get("/episode-pools")
    async def list_pools() -> list[dict[str, Any]]:
        return pools.listing()

    @app.put("/episode-pools/{pool_id}/heartbeat")
    async def heartbeat(pool_id: str) -> dict[str, Any]:
        return pools.heartbeat(pool_id)

    @app.get("/episode-pools/{pool_id}")
    async def describe_pool(pool_id: str) -> dict[str, Any]:
        return pools.describe(pool_id)

    @app.delete("/episode-pools/{pool_id}")
    async def close_pool(pool_id: str) -> dict[str, Any]:
        return await pools.close(pool_id)

    @app.post("/episode-pools/{pool_id}/containers")
    async def begin(pool_id: str, body: BeginEpisode) -> dict[str, Any]:
        if body.end:
            # Beside the begin, not before it: a slow destroy (a stalled pooled sandbox) must not
            # hold up a new container elsewhere; a begin waiting for a slot is woken by the end.
            service.spawn(pools.end_many(pool_id, [(e.container_id, e.status) for e in body.end]))
        # "ended": the client knows its ends were taken (an older daemon ignores the field).
        return {**await pools.begin(pool_id, env=body.env), "ended": len(body.end)}

    @app.delete("/episode-pools/{pool_id}/containers/{container_id}")
    async def end(pool_id: str, container_id: str, status: str = "ok") -> dict[str, Any]:
        return await pools.end(pool_id, container_id, status=status)

    @app.post("/sandboxes/{sandbox_id}/containers/{container_id}/exec")
    async def exec_(sandbox_id: str, container_id: str, body: exec_model) -> dict[str, Any]:  # type: ignore[valid-type]
        b: Any = body
        return await service.execfiles.exec(sandbox_id, b.argv, env=b.env, cwd=b.cwd, stdin=b.stdin, timeout=b.timeout,
                                  max_output=b.max_output, container=container_id)

    @app.post("/sandboxes/{sandbox_id}/containers/{container_id}/files/write")
    async def write_file(sandbox_id: str, container_id: str, body: write_model) -> dict[str, Any]:  # type: ignore[valid-type]
        b: Any = body
        return await service.execfiles.write_file(sandbox_id, b.path, b.data, b.mode, container=container_id)

    @app.post("/sandboxes/{sandbox_id}/containers/{container_id}/files/read")
    async def read_file(sandbox_id: str, container_id: str, body: path_model) -> dict[str, Any]:  # type: ignore[valid-type]
        b: Any = body
        return await service.execfiles.read_file(sandbox_id, b.path, container=container_id)

    @app.post("/sandboxes/{sandbox_id}/containers/{container_id}/files/list")
    async def list_files(sandbox_id: str, container_id: str, body: path_model) -> dict[str, Any]:  # type: ignore[valid-type]
        b: Any = body
        return await service.execfiles.list_files(sandbox_id, b.path, container=container_id)

    @app.post("/sandboxes/{sandbox_id}/containers/{container_id}/files/remove")
    async def remove_file(sandbox_id: str, container_id: str, body: path_model) -> dict[str, Any]:  # type: ignore[valid-type]
        b: Any = body
        return await service.execfiles.remove_file(sandbox_id, b.path, container=container_id)

    return pools
