"""The builder steps that Dockerfiles need beyond the SDK's own (see rollbox/sdk/dockerfile.py).

    {"kind": "config", "user"?: str, "entrypoint"?: [str]|None, "cmd"?: [str]|None,
     "expose"?: ["80/tcp"], "labels"?: {k: v}, "env"?: {K: v}, "workdir"?: "/"}
        image config only (no files). `env` values may hold "\\0NAME\\0" markers: the parent
        image's value of NAME (Docker's default PATH when it has none), so `ENV PATH=/x:$PATH`
        works on any base.
    {"kind": "copy", "path": dest, "tar": base64, "single": bool, "chown": "u[:g]"|None}
        the tar's entries placed under dest; `single`: one file that becomes dest itself unless
        dest is a directory in the image (Docker's COPY rule). `chown` names are looked up
        in the image's /etc/passwd and /etc/group; without it, entries are owned 0:0.
    {"kind": "copy_from", "stage": {"base": wire base, "steps": [...]}, "sources": [abs path],
     "path": dest, "dest_dir": bool, "chown": ..., "chmod": int|None}
        builds the stage as its own (cached) image, then copies each source out of its merged
        layers (owners and modes kept unless chown/chmod say otherwise).

Extraction never leaves the new layer: names are checked against their real paths (an entry
under a symlink the same tar made is refused), hard links must point inside, devices are
skipped.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .. import errors
from ..images.store import ImageConfig, ImageMeta, ImageStore
from .builder import EXTRA_KINDS, StepKind, _lookup, check_step, resolve_in_image

if TYPE_CHECKING:
    from .builder import Builder

EXT_KINDS = ("config", "copy", "copy_from")
SCRATCH_IMAGE_ID = "im-scratch"  # FROM scratch: an empty image (the agent still boots in it)
CONFIG_KEYS = ("user", "entrypoint", "cmd", "expose", "labels", "env", "workdir")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MARKER = re.compile("\x00(\\w+)\x00")


def _argv(v: Any) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(a, str) and "\0" not in a for a in v))


def check(step: dict[str, Any]) -> dict[str, Any]:
    """Validates a config/copy/copy_from step; raises InvalidArgument naming what is wrong."""
    kind = step["kind"]
    if kind == "config":
        keys = [k for k in step if k != "kind"]
        if not keys or any(k not in CONFIG_KEYS for k in keys):
            raise errors.InvalidArgument(f"a config step sets one or more of {', '.join(CONFIG_KEYS)}")
        if "user" in step and not (isinstance(step["user"], str) and step["user"] and "\0" not in step["user"]):
            raise errors.InvalidArgument("a config step's user must be a non-empty name or uid[:gid]")
        if not (_argv(step.get("entrypoint")) and _argv(step.get("cmd"))):
            raise errors.InvalidArgument("a config step's entrypoint/cmd must be a list of strings or null")
        if not all(isinstance(p, str) and re.fullmatch(r"\d{1,5}/(tcp|udp|sctp)", p) for p in step.get("expose", [])):
            raise errors.InvalidArgument("a config step's expose must list ports such as '8080/tcp'")
        for key in ("labels", "env"):
            d = step.get(key, {})
            if not isinstance(d, dict) or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in d.items()):
                raise errors.InvalidArgument(f"a config step's {key} must be a {{name: value}} dict of strings")
        if any("=" in k or "\0" in k for k in step.get("env", {})):
            raise errors.InvalidArgument("a config step's env names cannot contain '=' or NUL")
        if "workdir" in step and step["workdir"] != "/":
            raise errors.InvalidArgument("a config step's workdir may only be '/' (use a workdir step)")
        return step
    path = step.get("path")
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or ".." in Path(path).parts:
        raise errors.InvalidArgument(f"{kind} step path {path!r} must be an absolute path without '..'")
    chown = step.get("chown")
    if chown is not None and not (isinstance(chown, str) and re.fullmatch(r"[\w.-]+(:[\w.-]+)?", chown)):
        raise errors.InvalidArgument(f"{kind} step chown {chown!r} must be user[:group] or uid[:gid]")
    if kind == "copy":
        if not isinstance(step.get("tar"), str):
            raise errors.InvalidArgument("a copy step needs a base64 `tar`")
        return step
    stage = step.get("stage")
    if not isinstance(stage, dict) or not isinstance(stage.get("base"), dict) or not isinstance(stage.get("steps"), list) \
            or not all(isinstance(s, dict) for s in stage["steps"]):
        raise errors.InvalidArgument("a copy_from step needs a stage {base: {...}, steps: [{...}, ...]}")
    for s in stage["steps"]:
        check_step(s)  # the whole stage is refused before anything is built
    srcs = step.get("sources")
    if not isinstance(srcs, list) or not srcs or not all(isinstance(s, str) and s.startswith("/") and "\0" not in s for s in srcs):
        raise errors.InvalidArgument("a copy_from step needs absolute source paths")
    mode = step.get("chmod")
    if mode is not None and (isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777):
        raise errors.InvalidArgument(f"copy_from chmod {mode!r} must be a permission in 0..0o7777")
    return step


def describe(step: dict[str, Any]) -> str:
    if step["kind"] == "config":
        def show(v: Any) -> str:  # the markers inside a dict or list too, not their repr escapes
            if isinstance(v, dict):
                return "{" + ", ".join(f"{a}={show(b)}" for a, b in v.items()) + "}"
            if isinstance(v, list):
                return "[" + ", ".join(show(x) for x in v) + "]"
            return _MARKER.sub(r"${\1}", str(v))
        return ", ".join(f"{k}={show(step[k])}" for k in CONFIG_KEYS if k in step)
    if step["kind"] == "copy":
        return str(step["path"])
    return f"{' '.join(step['sources'])} -> {step['path']}"


async def apply(builder: "Builder", parent: str, step: dict[str, Any], rootfs: Path,
                config: ImageConfig) -> ImageConfig:
    """Builds one step into the empty layer `rootfs`; returns the image's new config.
    Raises ImageBuildError (a name --chown cannot find, a bad tar, a missing --from path)."""
    kind = step["kind"]
    if kind == "config":
        return _config(config, step)
    store = builder.svc.images
    lowers = store.layers(parent)
    owner = _owner(lowers, step["chown"]) if step.get("chown") else None
    if kind == "copy":
        try:
            raw = base64.b64decode(step["tar"], validate=True)
        except ValueError:
            raise errors.InvalidArgument(f"copy step {step['path']}: tar is not base64") from None
        await asyncio.to_thread(place, lowers, rootfs, step["path"], io.BytesIO(raw), bool(step.get("single")), owner)
        return config
    stage = step["stage"]
    base_id = await builder.svc.resolve_base(stage["base"])
    stage_id, _ = await builder.build(base_id, list(stage["steps"]))
    slowers = store.layers(stage_id)
    with tempfile.TemporaryFile(dir=rootfs.parent) as f:
        single = await asyncio.to_thread(_tar_from_image, slowers, step["sources"], f, step.get("chmod"))
        f.seek(0)
        await asyncio.to_thread(place, lowers, rootfs, step["path"], f, single and not step.get("dest_dir"), owner)
    return config


def ensure_scratch(store: ImageStore) -> str:
    """Stores the empty image that `FROM scratch` builds on (once); returns its id."""
    if not store.exists(SCRATCH_IMAGE_ID):
        staged = store.staging_dir("scratch")
        (staged / "rootfs").mkdir()
        try:
            store.add_image(ImageMeta(SCRATCH_IMAGE_ID, "filesystem", None, 0.0, source="FROM scratch"),
                            staged / "rootfs")
        except OSError:
            if not store.exists(SCRATCH_IMAGE_ID):  # not another build storing it at the same time
                raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    return SCRATCH_IMAGE_ID


def _config(config: ImageConfig, step: dict[str, Any]) -> ImageConfig:
    changes: dict[str, Any] = {k: step[k] for k in ("user", "entrypoint", "cmd") if k in step}
    if "workdir" in step:
        changes["working_dir"] = None
    if "expose" in step:
        changes["exposed_ports"] = list(dict.fromkeys([*config.exposed_ports, *step["expose"]]))
    if "labels" in step:
        changes["labels"] = {**config.labels, **step["labels"]}
    if "env" in step:
        old = config.env_dict()

        def var(m: re.Match[str]) -> str:
            return old.get(m.group(1), DEFAULT_PATH if m.group(1) == "PATH" else "")
        env = {**old, **{k: _MARKER.sub(var, v) for k, v in step["env"].items()}}
        changes["env"] = [f"{k}={v}" for k, v in env.items()]
    return replace(config, **changes)


def _read_db(lowers: list[Path], rel: str) -> dict[str, list[str]]:
    p = _lookup(lowers, rel)
    if p is None or p.is_symlink() or not p.is_file():
        return {}
    return {f[0]: f for f in (ln.split(":") for ln in p.read_text(errors="replace").splitlines()) if len(f) >= 4}


def _owner(lowers: list[Path], chown: str) -> tuple[int, int]:
    """--chown's user[:group] as numbers, names looked up in the image (Docker's rules: a
    user alone means its primary group; a numeric user without group means gid = uid)."""
    user, _, group = chown.partition(":")
    passwd = _read_db(lowers, "etc/passwd")
    if user.isdigit():
        uid, gid = int(user), int(user)
    elif user in passwd:
        uid, gid = int(passwd[user][2]), int(passwd[user][3])
    else:
        raise errors.ImageBuildError(f"--chown={chown}: no user {user!r} in the image's /etc/passwd; "
                                     "create it in an earlier RUN (useradd) or use a numeric uid")
    if group:
        groups = _read_db(lowers, "etc/group")
        if group.isdigit():
            gid = int(group)
        elif group in groups:
            gid = int(groups[group][2])
        else:
            raise errors.ImageBuildError(f"--chown={chown}: no group {group!r} in the image's /etc/group")
    return uid, gid


def _safe_filter(owner: tuple[int, int] | None):  # type: ignore[no-untyped-def]
    def f(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        m = tarfile.tar_filter(member, dest)  # no absolute names, nothing outside dest (symlinks resolved)
        if m.ischr() or m.isblk() or m.isfifo():
            return None
        if m.islnk():
            target = os.path.realpath(os.path.join(dest, m.linkname))
            if os.path.isabs(m.linkname) or os.path.commonpath([target, os.path.realpath(dest)]) != os.path.realpath(dest):
                raise errors.ImageBuildError(f"copy: hard link {m.name} -> {m.linkname} points outside the copy")
        attrs: dict[str, Any] = {"mode": member.mode & 0o7777, "uname": "", "gname": ""}
        if owner is not None:
            attrs["uid"], attrs["gid"] = owner
        return m.replace(**attrs, deep=False)
    return f


def _mkparents(lowers: list[Path], rootfs: Path, rel: str, owner: tuple[int, int] | None) -> None:
    """Creates rootfs/rel's directories in the new layer with the image's modes and owners
    (an upper directory's attributes hide the lower one's: /tmp must stay 1777)."""
    cur = ""
    for part in [p for p in rel.split("/") if p]:
        cur = f"{cur}/{part}" if cur else part
        d = rootfs / cur
        if d.is_dir():
            continue
        d.mkdir()
        low = _lookup(lowers, cur)
        if low is not None and low.is_dir():
            st = os.lstat(low)
            os.chown(d, st.st_uid, st.st_gid)
            os.chmod(d, stat.S_IMODE(st.st_mode))
        else:
            os.chmod(d, 0o755)
            if owner is not None and cur == rel:
                os.chown(d, *owner)


def place(lowers: list[Path], rootfs: Path, dest: str, tar: BinaryIO, single: bool,
          owner: tuple[int, int] | None) -> None:
    """Extracts `tar` into the layer `rootfs` at image path `dest` (see the module docstring)."""
    rel = ""
    if dest.strip("/"):
        resolved = resolve_in_image(lowers, dest)
        hit = _lookup(lowers, resolved.lstrip("/"))
        if hit is not None and hit.is_symlink():  # dest itself a link to a directory (/bin)
            probe = resolve_in_image(lowers, resolved + "/_")
            if (low := _lookup(lowers, posixpath.dirname(probe).lstrip("/"))) is not None and low.is_dir():
                resolved, hit = posixpath.dirname(probe), low
        rel = resolved.strip("/")
        is_dir = hit is not None and hit.is_dir() and not hit.is_symlink()
    else:
        is_dir = True
    try:
        with tarfile.open(fileobj=tar) as tf:
            members = tf.getmembers()
            if single and not is_dir:
                if len(members) != 1 or not members[0].isfile():
                    raise errors.ImageBuildError(f"copy to {dest}: expected one file")
                members[0].name = posixpath.basename(rel)
                rel = posixpath.dirname(rel)
                _mkparents(lowers, rootfs, rel, None)
            else:
                _mkparents(lowers, rootfs, rel, owner)
            tf.extractall(rootfs / rel, members, numeric_owner=True, filter=_safe_filter(owner))
    except (tarfile.TarError, ValueError) as e:
        raise errors.ImageBuildError(f"copy to {dest}: {e}") from None


def _whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(p: Path) -> bool:
    try:
        return os.getxattr(p, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def merged_children(lowers: list[Path], rel: str) -> dict[str, Path]:
    """The entries of directory `rel` in the image's merged view (overlayfs rules: upper
    layers win, whiteouts delete, an opaque directory hides the layers below)."""
    out: dict[str, Path | None] = {}
    for layer in lowers:
        d = layer / rel if rel else layer
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            break  # a file or whiteout here hides the directories below
        for name in os.listdir(d):
            if name not in out:
                out[name] = None if _whiteout(os.lstat(d / name)) else d / name
        if _opaque(d):
            break
    return {k: v for k, v in sorted(out.items()) if v is not None}


def _tar_from_image(lowers: list[Path], sources: list[str], f: BinaryIO, chmod: int | None) -> bool:
    """Tars each source path out of the image (a directory's contents, a file by its name);
    returns whether it was a single plain file. Raises ImageBuildError for a missing path."""
    single = False
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        def add(p: Path, arc: str) -> None:
            ti = tf.gettarinfo(str(p), arcname=arc)
            ti.uname = ti.gname = ""
            if chmod is not None and not ti.issym():
                ti.mode = chmod
            if ti.isreg():
                with open(p, "rb") as fh:
                    tf.addfile(ti, fh)
            elif ti.isdir() or ti.issym() or ti.islnk():
                tf.addfile(ti)

        def walk(rel: str, arc: str) -> None:
            for name, p in merged_children(lowers, rel).items():
                add(p, posixpath.join(arc, name) if arc else name)
                if p.is_dir() and not p.is_symlink():
                    walk(f"{rel}/{name}" if rel else name, posixpath.join(arc, name) if arc else name)

        for src in sources:
            # Every component followed inside the image, the last one too (Docker follows a
            # source that is a symlink).
            rel = posixpath.dirname(resolve_in_image(lowers, src.rstrip("/") + "/_")).strip("/") \
                if src.strip("/") else ""
            hit = _lookup(lowers, rel) if rel else lowers[-1]
            if hit is None or hit.is_symlink():
                raise errors.ImageBuildError(f"COPY --from: {src} does not exist in the source stage")
            if hit.is_dir():
                walk(rel, "")
            else:
                add(hit, posixpath.basename(src.rstrip("/")))
                single = len(sources) == 1 and hit.is_file()
    return single


for _kind in EXT_KINDS:
    EXTRA_KINDS[_kind] = StepKind(check, describe, apply)
