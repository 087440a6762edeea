"""The `rollbox` sandbox's configuration: a pydantic model, given inline or as a YAML file.

    sandbox=("rollbox", "rollbox.yaml")      # a file (relative to the task's directory)
    sandbox=("rollbox", "Dockerfile")        # a Dockerfile (Dockerfile, Dockerfile.x, x.Dockerfile)
    sandbox=SandboxEnvironmentSpec("rollbox", RollboxSandboxConfig(image="debian", memory=2048))

A `rollbox.yaml` (or `rollbox.yml`, else a `Dockerfile`) next to the task is picked up by
`sandbox="rollbox"` alone. A YAML file's `dockerfile` and `context` are relative to its directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import os

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ...sdk.image import Image

CONFIG_FILES = ["rollbox.yaml", "rollbox.yml", "Dockerfile"]
# Compose files: inspect's docker provider takes them; rollbox does not.
COMPOSE_FILES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")


class RollboxSandboxConfig(BaseModel):
    """One sample's sandbox. Unknown keys are an error (a typo must not be ignored).

    Attributes:
        image: "debian" (rollbox's Debian 12 base, the default), an image id ("im-..."),
            or a registry reference ("registry.example.com/repo/name:tag"). Not with `dockerfile`.
        dockerfile: a Dockerfile to build the image from (Image.from_dockerfile: every
            instruction a cached layer), built once per task in task_init. A relative path is
            relative to the YAML file's directory (inline: the working directory).
        context: the Dockerfile's build context directory (relative as `dockerfile`);
            None: the Dockerfile's directory.
        build_args: values for the Dockerfile's ARG instructions (`--build-arg NAME=value`).
        python: with image "debian": a Python version to build in ("3.11"); None: the base's.
        insecure_registry: pull a registry reference over plain HTTP.
        cpu: CPU cores (a float, CFS quota).
        memory: memory limit of the whole sandbox, MiB (gVisor's own ~100 MiB included).
        disk: cap on the writable layer, MiB; None: uncapped.
        network: False (default) blocks outbound traffic; True routes it through the host.
        allow_list: with network=True, the only IPv4 CIDRs and host names reachable.
        user: the default user of exec() and of the file calls (a name or numeric uid in
            the image's /etc/passwd); None: the image's own user (root for the Debian base).
        workdir: the per-sample working directory that relative paths and exec() start in
            (made at sample start); None: the image's WorkingDir, else the user's HOME.
        env: environment variables for every command.
        keep_warm_seconds: seconds without a call after which the daemon ends a sandbox left
            behind (e.g. by a killed eval); None: never.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = "debian"
    dockerfile: str | None = None
    context: str | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    python: str | None = None
    insecure_registry: bool = False
    cpu: float = Field(default=1.0, gt=0)
    memory: int = Field(default=1024, gt=0)
    disk: int | None = Field(default=4096, gt=0)
    network: bool = False
    allow_list: list[str] | None = None
    user: str | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    keep_warm_seconds: float | None = 3600

    @field_validator("image")
    @classmethod
    def _image_nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("image must be 'debian', an image id ('im-...') or a registry reference")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"workdir {v!r} must be an absolute path")
        return v

    @field_validator("user")
    @classmethod
    def _user_nonempty(cls, v: str | None) -> str | None:
        if v is not None and (not v or ":" in v or "\n" in v):
            raise ValueError(f"user {v!r} must be a user name or a numeric uid")
        return v

    @model_validator(mode="after")
    def _dockerfile_or_image(self) -> RollboxSandboxConfig:
        if self.dockerfile is None:
            if self.context is not None or self.build_args:
                raise ValueError("context and build_args apply to a dockerfile only")
        elif self.image != "debian" or self.python is not None:  # "debian": the default, as a dump says it
            raise ValueError("give either dockerfile or image (and python), not both")
        return self

    def to_image(self) -> Image:
        """The SDK image this configuration names (nothing is built or pulled yet; a
        Dockerfile and its context's files are read now).

        Raises:
            InvalidArgument: the Dockerfile or its context cannot be read, or rollbox cannot
                build it (a DockerfileError naming the line). ValueError: python= with an
                image other than "debian".
        """
        if self.dockerfile is not None:
            return Image.from_dockerfile(self.dockerfile, self.context, dict(self.build_args) or None)
        if self.image == "debian":
            return Image.debian(python=self.python)
        if self.python is not None:
            raise ValueError("python= applies to image 'debian' only")
        if self.image.startswith("im-"):
            return Image.from_id(self.image)
        return Image.from_registry(self.image, insecure=self.insecure_registry)


def load_config(config: object) -> RollboxSandboxConfig:
    """The configuration inspect hands a provider: None (defaults), a RollboxSandboxConfig,
    a dict of its fields, the path of a YAML file holding them (its `dockerfile` and `context`
    made absolute against the file's directory), or the path of a Dockerfile (`Dockerfile`,
    `Dockerfile.NAME`, `NAME.Dockerfile`, as inspect's docker provider names them).

    Raises:
        FileNotFoundError: no such file. ValueError: a bad value, an unknown key, a file that
            is not a YAML mapping, or a config of another provider's type (e.g. a compose file).
    """
    if config is None:
        return RollboxSandboxConfig()
    if isinstance(config, RollboxSandboxConfig):
        return config
    if isinstance(config, str):
        path = Path(config)
        if is_dockerfile(path):
            if not path.is_file():
                raise FileNotFoundError(f"{config}: no such Dockerfile")
            return RollboxSandboxConfig(dockerfile=os.path.abspath(path))
        if path.name in COMPOSE_FILES:
            raise ValueError(f"{config}: the rollbox sandbox takes a rollbox.yaml or a Dockerfile, not a compose "
                             "file (keys: image, dockerfile, context, build_args, cpu, memory, disk, network, "
                             "allow_list, user, workdir, env)")
        with path.open(encoding="utf-8") as f:
            data: Any = yaml.safe_load(f)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"{config}: expected a YAML mapping of rollbox sandbox settings, got {type(data).__name__}")
        base = os.path.dirname(os.path.abspath(path))
        for key in ("dockerfile", "context"):
            if isinstance(data.get(key), str):
                data[key] = os.path.normpath(os.path.join(base, data[key]))
        return _validate(data, str(config))
    if isinstance(config, dict):
        return _validate(config, "rollbox sandbox config")
    raise ValueError(f"rollbox sandbox config must be a file path, a dict or a RollboxSandboxConfig, "
                     f"got {type(config).__name__}")


def is_dockerfile(path: Path) -> bool:
    """Whether inspect would take `path` for a Dockerfile: `Dockerfile`, `Dockerfile.NAME` or
    `NAME.Dockerfile` (the suffix in any case)."""
    return path.stem == "Dockerfile" or path.suffix.lower() == ".dockerfile"


def _validate(data: dict[str, Any], where: str) -> RollboxSandboxConfig:
    try:
        return RollboxSandboxConfig.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{where}: {e}") from None
