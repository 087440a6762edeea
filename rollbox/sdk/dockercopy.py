"""COPY and ADD for the Dockerfile translation (rollbox/sdk/dockerfile.py): context sources
(globs, .dockerignore, ADD of a local tar), `--from` stages, and the FROM reference mapping."""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dockercontext import ContextTar, DockerIgnore, context_rel

if TYPE_CHECKING:
    from .dockerfile import DockerfileError, _Stage

# The daemon's ids (the SDK names them without importing the daemon's modules): the Debian base
# (rollbox/images/debian.py) and the empty image rollbox/server/dockerfile_steps.py stores.
DEBIAN_IMAGE_ID = "im-debian-bookworm"
SCRATCH_IMAGE_ID = "im-scratch"
DEBIAN_REF = re.compile(r"^(docker\.io/)?(library/)?debian(:(bookworm|12)[\w.-]*)?$")


def _json_list(value: str) -> list[str] | None:
    v = value.strip()
    if not v.startswith("["):
        return None
    try:
        out = json.loads(v)
    except ValueError:
        return None
    return out if isinstance(out, list) and all(isinstance(x, str) for x in out) else None


class CopyInstructions:
    """COPY/ADD as a part of the translator (which provides these attributes)."""

    context: Path
    ignore: DockerIgnore
    stages: list["_Stage"]
    line: int

    def err(self, message: str) -> "DockerfileError":
        raise NotImplementedError

    def subst(self, text: str, stage: "_Stage | None") -> str:
        raise NotImplementedError

    def words(self, text: str, stage: "_Stage | None", *, split: bool = True) -> list[str]:
        raise NotImplementedError

    def i_copy(self, value: str, stage: "_Stage") -> None:
        self.copy(value, stage, add=False)

    def i_add(self, value: str, stage: "_Stage") -> None:
        self.copy(value, stage, add=True)

    def copy(self, value: str, stage: "_Stage", add: bool) -> None:
        rest = value.strip()
        flags: dict[str, str] = {}
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            rest = rest.lstrip()
            name, _, fval = flag[2:].partition("=")
            if name not in ("chown", "chmod", "from", "link"):
                raise self.err(f"flag --{name} is not supported (rollbox supports --chown, --chmod, --from, --link)")
            flags[name] = self.subst(fval, stage)
        if "from" in flags and add:
            raise self.err("ADD has no --from; use COPY --from=STAGE")
        argv = _json_list(rest)
        parts = [self.subst(a, stage) for a in argv] if argv is not None else self.words(rest, stage)
        if len(parts) < 2:
            raise self.err("needs one or more sources and a destination")
        *srcs, dest = parts
        dest_dir = dest.endswith("/") or dest in (".", "..") or dest.endswith("/.") or len(srcs) > 1
        dest = posixpath.normpath(posixpath.join(stage.workdir, dest))
        chmod = None
        if flags.get("chmod"):
            if not re.fullmatch(r"[0-7]{3,4}", flags["chmod"]):
                raise self.err(f"--chmod={flags['chmod']!r} must be octal, e.g. --chmod=755")
            chmod = int(flags["chmod"], 8)
        chown = flags.get("chown") or None
        if "from" in flags:
            src_stage = self.copy_source_stage(flags["from"])
            if any(c in s for s in srcs for c in "*?["):
                raise self.err("wildcards in COPY --from sources are not supported; name each path")
            stage.steps.append({"kind": "copy_from", "stage": src_stage,
                                "sources": [posixpath.normpath("/" + s.lstrip("/")) for s in srcs], "path": dest,
                                "dest_dir": dest_dir, "chown": chown, "chmod": chmod})
            return
        tar = ContextTar(self.context, self.ignore, chmod)
        files: list[tuple[str, str, bool]] = []  # (context path, name, is a plain file)
        for src in srcs:
            if add and (re.match(r"^[a-z][a-z0-9+.-]*://", src) or src.startswith("git@")):
                raise self.err(f"ADD of a URL ({src}) is not supported: rollbox builds offline from the "
                               "context; download it into the context first, or RUN curl in the Dockerfile")
            files.extend(self.expand(src))
        if len(files) > 1:
            dest_dir = True
        single = len(files) == 1 and files[0][2] and not dest_dir
        for rel, name, is_file in files:
            path = self.context / rel
            if add and is_file and _is_archive(path):
                try:
                    tar.add_archive(path)
                except ValueError as e:
                    raise self.err(str(e)) from None
                single = False
            else:
                tar.add_source(rel, name if is_file else "")
        stage.steps.append({"kind": "copy", "path": dest, "tar": base64.b64encode(tar.close()).decode(),
                            "single": single, "chown": chown})

    def expand(self, src: str) -> list[tuple[str, str, bool]]:
        """The context entries `src` names (a glob: each match), .dockerignore applied, each as
        (context path with a symlink source followed, its name, is a plain file)."""
        try:
            rel = context_rel(self.context, src)
        except ValueError as e:
            raise self.err(str(e)) from None
        if any(c in rel for c in "*?["):
            hits = sorted(str(p.relative_to(self.context)) for p in self.context.glob(rel))
        else:
            hits = [rel] if (self.context / rel).exists() or (self.context / rel).is_symlink() else []
        hits = [h for h in hits if h == "." or not self.ignore.excluded(h) or (self.context / h).is_dir()]
        if not hits:
            raise self.err(f"source {src!r} is not in the build context {self.context} (or .dockerignore "
                           "excludes it)")
        out = []
        for h in hits:
            real = Path(os.path.realpath(self.context / h))  # Docker follows a source that is a symlink
            if real != self.context and self.context not in real.parents:
                raise self.err(f"source {h!r} is a symbolic link to {real}, outside the build context")
            if not real.exists():
                raise self.err(f"source {h!r} is a dangling symbolic link")
            rel = str(real.relative_to(self.context)) if real != self.context else "."
            out.append((rel, posixpath.basename(h), real.is_file()))
        return out

    def copy_source_stage(self, ref: str) -> dict[str, Any]:
        for s in self.stages:
            if s.name is not None and s.name == ref.lower():
                return {"base": dict(s.base), "steps": list(s.steps)}
        if ref.isdigit():
            if int(ref) >= len(self.stages) - 1:
                raise self.err(f"--from={ref}: stage {ref} is not an earlier stage")
            s = self.stages[int(ref)]
            return {"base": dict(s.base), "steps": list(s.steps)}
        return {"base": base_of(ref), "steps": []}  # Docker: --from=IMAGE copies from an image


def _is_archive(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False



def base_of(ref: str) -> dict[str, Any]:
    """The builder's wire base for a FROM reference: the Debian base for `debian`,
    `debian:bookworm*` and `debian:12*`, the empty image for `scratch`, else a registry pull."""
    if DEBIAN_REF.match(ref.lower()):
        return {"image_id": DEBIAN_IMAGE_ID}
    if ref.lower() == "scratch":
        return {"image_id": SCRATCH_IMAGE_ID}
    return {"registry": ref, "credentials": None, "insecure": False}
