"""Images and volumes as the service sees them: building and resolving images, capturing a
sandbox's filesystem as an image, and deleting images and volumes only when nothing uses them."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import errors
from ..images.debian import DEBIAN_IMAGE_ID
from . import dockerfile_steps  # FROM scratch; importing it also adds its step kinds to the builder
from .builder import Builder
from .context import ServiceContext
from .registry import Running
from .lifecycle import NOT_ENDED


class Artifacts:
    def __init__(self, ctx: ServiceContext, builder: Builder, running: Running) -> None:
        self.ctx = ctx
        self.reg = ctx.registry
        self.builder = builder
        self.running = running

    def delete_image(self, image_id: str) -> None:
        """Deletes an image; refused (InvalidState) while a sandbox, snapshot or image uses it."""
        ctx = self.ctx
        ctx.images.meta(image_id)
        users = [r["sandbox_id"] for r in ctx.store.list_rows(NOT_ENDED) if r["image_id"] == image_id]
        users += [m.snapshot_id for m in ctx.snapshots.list() if m.image_id == image_id]
        users += ctx.images.children(image_id)
        if users:
            raise errors.InvalidState(f"image {image_id} is used by {', '.join(users[:5])}"
                                      f"{' and more' if len(users) > 5 else ''}; remove those first")
        ctx.images.delete(image_id)

    def delete_volume(self, name: str) -> None:
        """Deletes a volume; refused while a sandbox (booting, running or paused) mounts it or a
        stored snapshot would mount it on restore."""
        ctx = self.ctx
        users = self.reg.mounts.users(name)
        if users:
            raise errors.InvalidState(f"volume {name!r} is mounted by sandbox {users[0]} (starting, running or ending); "
                                      "terminate it first")
        snaps = [m.snapshot_id for m in ctx.snapshots.list() if any(v["name"] == name for v in m.volumes)]
        if snaps:
            raise errors.InvalidState(f"volume {name!r} is mounted by snapshot(s) {', '.join(snaps[:5])}; "
                                      "delete those first (`rollbox snapshot rm`)")
        for row in ctx.store.list_rows(NOT_ENDED):
            if any(v["name"] == name for v in json.loads(row["volumes"] or "[]")):
                raise errors.InvalidState(f"volume {name!r} is mounted by sandbox {row['sandbox_id']}; "
                                          "terminate it first")
        ctx.volumes.delete(name)

    async def build_image(self, base: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
        """Resolves `base` to a stored image (the Debian base, an image id, a registry pull, a
        docker-save archive or an OCI layout, each imported once) and builds `steps` on it."""
        image_id = await self.resolve_base(base)
        final, reports = await self.builder.build(image_id, steps)
        return {"image_id": final, "base_image_id": image_id, "steps": [asdict(r) for r in reports]}

    async def resolve_base(self, base: dict[str, Any]) -> str:
        from ..images import archive, registry  # the OCI importers

        images = self.ctx.images
        if base.get("registry"):
            cred = base.get("credentials")
            meta = await asyncio.to_thread(registry.pull, images, str(base["registry"]),
                                           tuple(cred) if cred else None, bool(base.get("insecure")))
            return meta.image_id
        if base.get("docker_archive"):
            meta = await asyncio.to_thread(archive.import_docker_archive, images, Path(str(base["docker_archive"])))
            return meta.image_id
        if base.get("oci_layout"):
            meta = await asyncio.to_thread(archive.import_oci_layout, images, Path(str(base["oci_layout"])),
                                           base.get("ref"))
            return meta.image_id
        image_id = str(base.get("image_id") or DEBIAN_IMAGE_ID)
        if image_id == DEBIAN_IMAGE_ID:
            await asyncio.to_thread(images.ensure_debian)
        elif image_id == dockerfile_steps.SCRATCH_IMAGE_ID:  # a Dockerfile's FROM scratch
            await asyncio.to_thread(dockerfile_steps.ensure_scratch, images)
        images.meta(image_id)
        return image_id

    async def create_image_from_filesystem(self, sandbox_id: str) -> str:
        """An image of everything the sandbox wrote, on top of its own image; returns its id."""
        lv = await self.running(sandbox_id)
        meta = await asyncio.to_thread(self.ctx.images.create_from_upper, self.ctx.upper_dir(sandbox_id), lv.image_id)
        return meta.image_id
