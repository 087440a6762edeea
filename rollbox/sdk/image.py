"""Image: which root filesystem a sandbox boots from, and how to build one.

An `Image` is a description: a base (the Debian base, a stored image id, an OCI registry
reference, a `docker save` archive or an OCI layout) plus build steps. Nothing happens until a
sandbox is created from it (or `build()` is called); the daemon then imports the base once and
builds each step once, as a cached, content-addressed layer shared by every image that has
the same prefix (see rollbox/server/builder.py).

    img = (Image.debian(python="3.11")
           .apt_install("git")
           .pip_install("numpy", "gymnasium")
           .env({"MODE": "train"})
           .workdir("/app")
           .add_local_file("policy.py", "/app/policy.py"))
    sb = Sandbox(image=img).create()
"""

from __future__ import annotations

import base64
import io
import os
import shlex
import sys
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ._aio import synchronized

BUILD_NOTICE_S = 3.0  # seconds a build may take before the SDK says it is building

if TYPE_CHECKING:
    from ..client.transport import Client

DEBIAN_IMAGE_ID = "im-debian-bookworm"
DEBIAN_PYTHON = "3.11"  # Debian 12's python3

APT = ("apt-get update -qq && apt-get install -y -qq --no-install-recommends {pkgs} "
       "&& rm -rf /var/lib/apt/lists/*")
ENSURE_PIP = ("python3 -m pip --version >/dev/null 2>&1 || (" + APT.format(pkgs="python3-pip") + ")")


def _check_strings(what: str, items: tuple[str, ...]) -> list[str]:
    if not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise InvalidArgument(f"{what} needs one or more non-empty strings")
    return list(items)


@dataclass(frozen=True)
class Image:
    """A reference to an image, or a recipe for one.

    `Image.debian()` is the default base (Debian 12 minbase with python3, built once by
    debootstrap); `Image.from_id(id)` names any stored image, e.g. one made by
    `sb.create_image_from_filesystem()`; `from_registry`, `from_docker_archive` and
    `from_oci_layout` import OCI/Docker images. Builder methods return a new Image.
    """

    image_id: str = DEBIAN_IMAGE_ID
    base: tuple[tuple[str, Any], ...] = ()  # ("registry", REF), ... : an import instead of image_id
    steps: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    # ---- bases ---------------------------------------------------------------------------

    @classmethod
    def debian(cls, python: str | None = None) -> "Image":
        """Debian 12 (bookworm) with python3. `python`: only "3.11" (Debian 12's) is
        available here; for another version use `Image.from_registry("python:3.12-slim")`.
        Raises InvalidArgument for another version."""
        if python is not None and str(python) != DEBIAN_PYTHON:
            raise InvalidArgument(f"Image.debian(python={python!r}): Debian 12 ships Python {DEBIAN_PYTHON}; "
                                  f"use Image.from_registry('python:{python}-slim') for another version")
        return cls(DEBIAN_IMAGE_ID)

    @classmethod
    def from_id(cls, image_id: str) -> "Image":
        """Raises nothing here; an unknown id fails at `create()` with `ImageNotFound`."""
        return cls(image_id)

    @classmethod
    def from_registry(cls, reference: str, credentials: tuple[str, str] | None = None,
                      insecure: bool = False) -> "Image":
        """An image from an OCI registry (Docker Registry HTTP API v2): "repo/name:tag",
        "host:port/repo/name:tag" or "...@sha256:<digest>". `credentials`: (user, password or
        token) for basic or token auth; `insecure`: plain HTTP (always used for localhost).
        The daemon pulls it once (linux/amd64 from a multi-arch index; gzip and zstd layers,
        each verified against its digest). Errors at build/create time: ImageNotFound (no
        such repository or tag), ImagePullError (registry unreachable or interrupted; retry),
        ImageCorrupt (digest mismatch), UnsupportedImage (media type or platform)."""
        if not isinstance(reference, str) or not reference.strip():
            raise InvalidArgument("Image.from_registry needs a reference such as 'python:3.11-slim'")
        cred = list(credentials) if credentials else None
        return cls("", (("registry", reference.strip()), ("credentials", cred), ("insecure", bool(insecure))))

    @classmethod
    def from_docker_archive(cls, path: str | os.PathLike[str]) -> "Image":
        """The tar that `docker save` writes, on the daemon's machine."""
        return cls("", (("docker_archive", str(Path(path).resolve())),))

    @classmethod
    def from_oci_layout(cls, path: str | os.PathLike[str], ref: str | None = None) -> "Image":
        """An OCI image layout directory (or a tar of one) on the daemon's machine; `ref`
        picks a manifest by its org.opencontainers.image.ref.name annotation."""
        return cls("", (("oci_layout", str(Path(path).resolve())), ("ref", ref)))

    @classmethod
    def from_dockerfile(cls, path: str | os.PathLike[str], context_dir: str | os.PathLike[str] | None = None,
                        build_args: dict[str, str] | None = None, target: str | None = None) -> "Image":
        """An image built from a Dockerfile (Beam's and Modal's name), each instruction one
        cached layer: FROM, RUN, COPY/ADD (from `context_dir`, default the Dockerfile's
        directory, with its .dockerignore; `--chown`, `--chmod`, `--from=STAGE`), ENV, ARG
        (`build_args` override defaults), WORKDIR, USER, ENTRYPOINT, CMD, EXPOSE, LABEL.
        `target`: the stage to build (default the last). The context files are read now.
        See rollbox/sdk/dockerfile.py for the mapping.

        Raises:
            DockerfileError (an InvalidArgument): an unsupported instruction (HEALTHCHECK,
                SHELL, VOLUME, ...) or RUN flag (`--mount`, `--network`, `--security`), ADD
                of a URL, a source missing from the context; the message names the line.
                (`FROM scratch` builds: an empty image, whose RUN has no shell, as in Docker.)
            InvalidArgument: the Dockerfile or context cannot be read.
        """
        import warnings

        from .dockerfile import translate

        t = translate(path, context_dir, build_args, target)
        for w in t.warnings:
            warnings.warn(w, stacklevel=2)
        if t.base.get("image_id") == DEBIAN_IMAGE_ID:
            return cls(DEBIAN_IMAGE_ID, (), tuple(t.steps))
        if "image_id" in t.base:  # FROM scratch: the daemon stores the empty image on first use
            return cls(str(t.base["image_id"]), tuple(t.base.items()), tuple(t.steps))
        return cls("", tuple(t.base.items()), tuple(t.steps))

    # ---- build steps ---------------------------------------------------------------------

    def _step(self, step: dict[str, Any]) -> "Image":
        return Image(self.image_id, self.base, (*self.steps, step))

    def run_commands(self, *commands: str) -> "Image":
        """Shell commands (`/bin/sh -c`), run in order in a sandbox with network access."""
        return self._step({"kind": "run", "commands": _check_strings("run_commands", commands)})

    def apt_install(self, *packages: str) -> "Image":
        """Debian packages (apt-get install --no-install-recommends; lists removed after)."""
        pkgs = " ".join(shlex.quote(p) for p in _check_strings("apt_install", packages))
        return self._step({"kind": "run", "commands": [APT.format(pkgs=pkgs)]})

    def pip_install(self, *packages: str, extra_args: str = "") -> "Image":
        """PyPI packages for the image's python3 (pip is installed first if missing)."""
        pkgs = " ".join(shlex.quote(p) for p in _check_strings("pip_install", packages))
        return self._step({"kind": "run", "commands": [ENSURE_PIP,
                                                       f"python3 -m pip install -q {extra_args} {pkgs}".replace("  ", " ")]})

    def env(self, variables: dict[str, str]) -> "Image":
        """Environment variables for every later step and every command in the sandbox."""
        if not isinstance(variables, dict) or not variables:
            raise InvalidArgument("env() needs a non-empty {NAME: value} dict")
        return self._step({"kind": "env", "env": {str(k): str(v) for k, v in variables.items()}})

    def workdir(self, path: str) -> "Image":
        """The working directory of later steps and of commands in the sandbox (created)."""
        return self._step({"kind": "workdir", "path": path})

    def add_local_file(self, local_path: str | os.PathLike[str], remote_path: str, mode: int | None = None) -> "Image":
        """Copies a file from this machine into the image (read now; its content is part of
        the cache key). Raises InvalidArgument when it is not a readable file."""
        p = Path(local_path)
        if not p.is_file():
            raise InvalidArgument(f"add_local_file: {p} is not a file")
        data = p.read_bytes()
        return self._step({"kind": "file", "path": remote_path, "data": base64.b64encode(data).decode(),
                           "mode": mode if mode is not None else (p.stat().st_mode & 0o7777)})

    def add_local_dir(self, local_path: str | os.PathLike[str], remote_path: str) -> "Image":
        """Copies a directory's contents from this machine into the image."""
        p = Path(local_path)
        if not p.is_dir():
            raise InvalidArgument(f"add_local_dir: {p} is not a directory")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for child in sorted(p.iterdir()):
                tf.add(child, arcname=child.name, filter=_reproducible)
        return self._step({"kind": "dir", "path": remote_path, "tar": base64.b64encode(buf.getvalue()).decode()})

    # Beam's names.
    def add_python_packages(self, *packages: str) -> "Image":
        return self.pip_install(*packages)

    def add_commands(self, *commands: str) -> "Image":
        return self.run_commands(*commands)

    # ---- resolution ----------------------------------------------------------------------

    @property
    def needs_build(self) -> bool:
        return bool(self.steps or self.base)

    def _base_name(self) -> str:
        """What the base is, for a progress message: its registry reference, archive or id."""
        b = dict(self.base) if self.base else {}
        return str(b.get("registry") or b.get("docker_archive") or b.get("oci_layout") or self.image_id or "base")

    def base_wire(self) -> dict[str, Any]:
        return dict(self.base) if self.base else {"image_id": self.image_id}

    @synchronized
    async def build(self, client: "Client | None" = None) -> str:
        """Imports the base and builds the steps (cached); returns the image id."""
        return str((await self.build_report.aio(client))["image_id"])

    @synchronized
    async def build_report(self, client: "Client | None" = None) -> dict[str, Any]:
        """As build(), with {"image_id", "base_image_id", "steps": [{"step", "image_id",
        "cached", "seconds"}]}. Raises ImageBuildError (a step failed; its output is in the
        message) and the errors of the base (see from_registry)."""
        from ..client.default import default_client

        c = client or default_client()
        # A first build runs its steps (minutes for apt/pip); a cached one answers at once. Say
        # so on stderr when it takes a while, instead of a silent wait.
        what = (f"building image ({len(self.steps)} step(s) not cached yet; each runs once, then is cached)"
                if self.steps else f"fetching image {self._base_name()} (once; then it is stored)")
        notice = threading.Timer(BUILD_NOTICE_S, lambda: print(f"rollbox: {what}...", file=sys.stderr, flush=True))
        notice.daemon = True
        notice.start()
        try:
            return dict(await c.aio.request("POST", "/images/build", json={"base": self.base_wire(), "steps": list(self.steps)}))
        finally:
            notice.cancel()

    @synchronized
    async def resolve(self, client: "Client") -> str:
        """The image id a sandbox boots: this id, or the built one."""
        return await self.build.aio(client) if self.needs_build else self.image_id


def _reproducible(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    # Only content and mode go into the cache key: not owners or times of the local copy.
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 0
    return ti
