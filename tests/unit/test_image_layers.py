"""Importing OCI/Docker images: layers in overlayfs form, safe extraction, digests, archives,
OCI layouts, references, and the registry client against an in-memory registry (httpx
MockTransport). Every tar is built here with the tarfile module; nothing touches the network.

Whiteouts (0:0 character devices, trusted.* xattrs) need root: those tests skip without it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from rollbox.errors import ImageCorrupt, ImageNotFound, ImagePullError, InvalidArgument, UnsupportedImage
from rollbox.images import layers as layers_mod
from rollbox.images import registry as registry_mod
from rollbox.images.archive import import_docker_archive, import_oci_layout
from rollbox.images.layers import LayerBlob, apply_layer, store_layer
from rollbox.images.manifest import DOCKER_LAYER_GZIP, OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD, image_id_for
from rollbox.images.registry import Reference, parse_reference, pull
from rollbox.images.store import ImageStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts (mknod, trusted.* xattrs) need root")


# ---- building layers ---------------------------------------------------------------------------

@dataclass
class E:
    """One tar member: kind f(ile) d(ir) l (symlink) h (hardlink) c (char device) p (fifo)."""

    name: str
    kind: str = "f"
    data: bytes = b""
    link: str = ""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    mtime: int = 1_600_000_000
    pax: dict[str, str] = field(default_factory=dict)


def make_tar(entries: list[E]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e.name)
            ti.mode, ti.uid, ti.gid, ti.mtime = e.mode, e.uid, e.gid, e.mtime
            ti.pax_headers = dict(e.pax)
            ti.type = {"f": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE,
                       "c": tarfile.CHRTYPE, "p": tarfile.FIFOTYPE}[e.kind]
            ti.linkname = e.link
            if e.kind == "c":
                ti.devmajor, ti.devminor = 1, 3
            ti.size = len(e.data) if e.kind == "f" else 0
            tf.addfile(ti, io.BytesIO(e.data) if e.kind == "f" else None)
    return buf.getvalue()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def zstd_compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def apply(data: bytes, dest: Path, media_type: str = OCI_LAYER_TAR, digest: str | None = None,
          diff_id: str | None = None) -> str:
    return apply_layer(io.BytesIO(data), dest, media_type, digest, diff_id)


def blob(data: bytes, media_type: str = OCI_LAYER_TAR, digest: str | None = None) -> LayerBlob:
    return LayerBlob(media_type, digest, lambda: io.BytesIO(data), "test layer")


def assert_store_clean(store: ImageStore, layers: set[str] | None = None) -> None:
    """No staging leftovers, exactly `layers` committed, and no image dirs."""
    base = store.root / "_layers"
    names = {p.name for p in base.iterdir()} if base.is_dir() else set()
    assert not {n for n in names if n.startswith(".tmp-")}, f"staging left behind: {names}"
    assert names == (layers or set())


def outside_untouched(sentinel: Path) -> None:
    assert sorted(p.name for p in sentinel.iterdir()) == ["keep"]
    assert (sentinel / "keep").read_bytes() == b"original"


# ---- overlayfs form -------------------------------------------------------------------------------

@needs_root
def test_whiteouts_become_overlayfs_whiteouts(tmp_path: Path) -> None:
    data = make_tar([E("etc", "d", mode=0o755), E("etc/.wh.passwd"), E(".wh.gone"),
                     E("var", "d"), E("var/.wh..wh..opq"), E("var/new", data=b"n"),
                     E("opq-first/.wh..wh..opq"), E("opq-first", "d", mode=0o700),
                     E(".wh..wh.plnk")])  # AUFS metadata: ignored
    dest = tmp_path / "layer"
    assert apply(data, dest, diff_id=sha(data)) == sha(data)
    for p in (dest / "etc/passwd", dest / "gone"):
        st = os.lstat(p)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert not list(dest.rglob(".wh.*"))
    assert os.getxattr(dest / "var", "trusted.overlay.opaque") == b"y"
    assert (dest / "var/new").read_bytes() == b"n"
    # The opaque marker may come before its directory's own entry: the xattr stays.
    assert os.getxattr(dest / "opq-first", "trusted.overlay.opaque") == b"y"
    assert stat.S_IMODE(os.lstat(dest / "opq-first").st_mode) == 0o700
    assert sorted(p.name for p in dest.iterdir()) == ["etc", "gone", "opq-first", "var"]


@needs_root
def test_whiteout_does_not_hide_same_layer_file(tmp_path: Path) -> None:
    # layer.md: a whiteout applies to lower layers only, never to files of its own layer.
    data = make_tar([E("a", data=b"mine"), E(".wh.a")])
    apply(data, tmp_path / "l")
    assert (tmp_path / "l/a").read_bytes() == b"mine"


@needs_root
def test_overlay_mount_hides_whiteouts(tmp_path: Path) -> None:
    lower = make_tar([E("keep", data=b"k"), E("gone", data=b"g"), E("d", "d"), E("d/old", data=b"o"),
                      E("e", "d"), E("e/stays", data=b"s")])
    upper = make_tar([E(".wh.gone"), E("d", "d"), E("d/.wh..wh..opq"), E("d/new", data=b"n"),
                      E("e", "d"), E("e/added", data=b"a")])
    apply(lower, tmp_path / "lower")
    apply(upper, tmp_path / "upper")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                          f"lowerdir={tmp_path / 'upper'}:{tmp_path / 'lower'}", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount overlayfs here: {res.stderr.strip()}")
    try:
        assert sorted(os.listdir(mnt)) == ["d", "e", "keep"]
        assert os.listdir(mnt / "d") == ["new"]
        assert sorted(os.listdir(mnt / "e")) == ["added", "stays"]
        assert (mnt / "keep").read_bytes() == b"k"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_metadata_and_links_preserved(tmp_path: Path) -> None:
    data = make_tar([
        E("bin", "d", mode=0o755, mtime=1000),
        E("bin/tool", data=b"#!/bin/sh\n", mode=0o4755, uid=1234, gid=5678, mtime=2000,
          pax={"SCHILY.xattr.user.note": "hi", "SCHILY.xattr.trusted.overlay.redirect": "/etc"}),
        E("bin/same", "h", link="bin/tool"),
        E("abs", "l", link="/etc/passwd", uid=7, gid=8, mtime=3000),
        E("rel", "l", link="../../../../etc/shadow"),
        E("private", "d", mode=0o700, uid=1000, gid=1000, mtime=4000),
        E("private/f", data=b"x", mode=0o600),
        E("fifo", "p", mode=0o640),
        E("dev-null", "c"),
        E("/absolute/file", data=b"made relative"),
        E("./dot/file", data=b"dot"),
    ])
    dest = tmp_path / "layer"
    apply(data, dest)
    tool = os.lstat(dest / "bin/tool")
    assert stat.S_IMODE(tool.st_mode) == 0o4755 and tool.st_mtime == 2000
    if os.geteuid() == 0:
        assert (tool.st_uid, tool.st_gid) == (1234, 5678)
        assert os.lstat(dest / "abs").st_uid == 7
        assert os.lstat(dest / "private").st_uid == 1000
    assert os.getxattr(dest / "bin/tool", "user.note") == b"hi"
    assert "trusted.overlay.redirect" not in os.listxattr(dest / "bin/tool")
    assert os.lstat(dest / "bin/same").st_ino == tool.st_ino
    assert os.readlink(dest / "abs") == "/etc/passwd"  # verbatim, never resolved on the host
    assert os.readlink(dest / "rel") == "../../../../etc/shadow"
    assert os.lstat(dest / "abs").st_mtime == 3000
    priv = os.lstat(dest / "private")
    assert stat.S_IMODE(priv.st_mode) == 0o700 and priv.st_mtime == 4000  # set after its children
    assert os.lstat(dest / "bin").st_mtime == 1000
    assert stat.S_ISFIFO(os.lstat(dest / "fifo").st_mode)
    assert not os.path.lexists(dest / "dev-null")  # device nodes are skipped
    assert (dest / "absolute/file").read_bytes() == b"made relative"
    assert (dest / "dot/file").read_bytes() == b"dot"


def test_later_member_replaces_earlier(tmp_path: Path) -> None:
    data = make_tar([E("x", "d"), E("x/in", data=b"1"), E("x", data=b"now a file"),
                     E("y", "l", link="x"), E("y", "d"), E("y/f", data=b"2")])
    apply(data, tmp_path / "l")
    assert (tmp_path / "l/x").read_bytes() == b"now a file"
    assert (tmp_path / "l/y").is_dir() and not (tmp_path / "l/y").is_symlink()


# ---- escapes ----------------------------------------------------------------------------------------

@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    """A directory outside the layer that no member may touch."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "keep").write_bytes(b"original")
    return d


@pytest.mark.parametrize("entries", [
    [E("../outside/evil", data=b"x")],
    [E("a/../../outside/evil", data=b"x")],
    [E("link", "l", link="{outside}"), E("link/evil", data=b"x")],
    [E("link", "l", link="{outside}"), E("link/keep", data=b"overwritten")],
    [E("d", "d"), E("d/up", "l", link="../../outside"), E("d/up/evil", data=b"x")],
    [E("link", "l", link="{outside}"), E("link/sub", "d")],
    [E("link", "l", link="{outside}"), E("link/evil", "l", link="/etc/shadow")],
    [E("hard", "h", link="../outside/keep")],
    [E("hard", "h", link="{outside}/keep")],  # absolute: taken inside the layer, where it is missing
    [E("link", "l", link="{outside}"), E("hard", "h", link="link/keep")],
    [E("f", data=b"x"), E("f/evil", data=b"x")],
], ids=["dotdot", "inner-dotdot", "symlink-parent", "symlink-overwrite", "relative-symlink-parent",
        "symlink-mkdir", "symlink-symlink", "hardlink-dotdot", "hardlink-absolute", "hardlink-through-symlink",
        "file-as-parent"])
def test_escapes_are_rejected(tmp_path: Path, sentinel: Path, entries: list[E]) -> None:
    for e in entries:
        e.link = e.link.replace("{outside}", str(sentinel))
    data = make_tar(entries)
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageCorrupt) as ei:
        store_layer(store, blob(data), sha(data))
    assert "member" in str(ei.value) and "not imported" in str(ei.value)
    outside_untouched(sentinel)
    assert_store_clean(store)


# ---- digests and corruption ----------------------------------------------------------------------

def test_digest_mismatch_commits_nothing(tmp_path: Path) -> None:
    data = make_tar([E("f", data=b"hello")])
    gz = gzip.compress(data)
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageCorrupt, match="does not match its digest"):
        store_layer(store, blob(gz, OCI_LAYER_GZIP, sha(b"something else")), sha(data))
    assert_store_clean(store)
    with pytest.raises(ImageCorrupt, match="diff_id"):
        store_layer(store, blob(gz, OCI_LAYER_GZIP, sha(gz)), sha(b"another diff"))
    assert_store_clean(store)
    # A retry with the right content succeeds and is committed under the diff_id.
    key = store_layer(store, blob(gz, OCI_LAYER_GZIP, sha(gz)), sha(data))
    assert key == "sha256-" + hashlib.sha256(data).hexdigest()
    assert_store_clean(store, {key})
    assert (store.layer_dir(key) / "f").read_bytes() == b"hello"


def test_truncated_gzip_is_corrupt(tmp_path: Path) -> None:
    data = make_tar([E("f", data=os.urandom(100_000))])
    gz = gzip.compress(data)
    with pytest.raises(ImageCorrupt, match="gzip"):
        apply(gz[: len(gz) // 2], tmp_path / "a", OCI_LAYER_GZIP)
    with pytest.raises(ImageCorrupt):
        apply(b"\x1f\x8bnot really gzip", tmp_path / "b", DOCKER_LAYER_GZIP)
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageCorrupt):
        store_layer(store, blob(gz[:-9], OCI_LAYER_GZIP), sha(data))
    assert_store_clean(store)


@pytest.mark.parametrize("cut", [700, 1536, -1024], ids=["mid-header", "block-boundary-mid-data", "no-end-marker"])
def test_truncated_tar(tmp_path: Path, cut: int) -> None:
    data = make_tar([E("a", data=b"x" * 2000), E("b", data=b"y")])
    truncated = data[:cut]
    if cut == -1024:
        # A tar ending right after its last member (no zero blocks) is accepted, as Go's
        # archive/tar does; the diff_id still catches a truncation there.
        apply(truncated, tmp_path / "ok")
        with pytest.raises(ImageCorrupt, match="diff_id"):
            apply(truncated, tmp_path / "bad", diff_id=sha(data))
        return
    with pytest.raises(ImageCorrupt):
        apply(truncated, tmp_path / "l")


def test_garbage_after_members_is_corrupt(tmp_path: Path) -> None:
    data = make_tar([E("a", data=b"x")])
    with pytest.raises(ImageCorrupt, match="invalid tar header"):
        apply(data[:1024] + b"\xff" * 512 + data[1024:], tmp_path / "l")
    with pytest.raises(ImageCorrupt):
        apply(b"this is not a tar archive at all" * 40, tmp_path / "m")


def test_zstd_layer(tmp_path: Path) -> None:
    data = make_tar([E("z", "d"), E("z/file", data=os.urandom(300_000)), E("z/small", data=b"s")])
    zs = zstd_compress(data)
    assert apply(zs, tmp_path / "l", OCI_LAYER_ZSTD, sha(zs), sha(data)) == sha(data)
    assert (tmp_path / "l/z/small").read_bytes() == b"s"
    with pytest.raises(ImageCorrupt, match="zstd"):
        apply(zs[: len(zs) // 2], tmp_path / "t", OCI_LAYER_ZSTD)
    with pytest.raises(ImageCorrupt, match="does not match its digest"):
        apply(zs, tmp_path / "d", OCI_LAYER_ZSTD, sha(b"other"), sha(data))
    with pytest.raises(ImageCorrupt):
        apply(zs[:-7], tmp_path / "t7", OCI_LAYER_ZSTD)
    # Two frames back to back (zstd -c a b; pigz-style multi-frame) are one stream.
    two = zstd_compress(data[:100_000]) + zstd_compress(data[100_000:])
    assert apply(two, tmp_path / "two", OCI_LAYER_ZSTD, sha(two), sha(data)) == sha(data)


@pytest.mark.parametrize("media_type", [
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+bzip2",
    "application/octet-stream",
])
def test_unsupported_media_type(tmp_path: Path, media_type: str) -> None:
    with pytest.raises(UnsupportedImage):
        apply(make_tar([E("f")]), tmp_path / "l", media_type)


# ---- archives and layouts ------------------------------------------------------------------------

ROOTFS_BOTTOM = [E("etc", "d"), E("etc/os-release", data=b"ID=tiny\n"), E("bin", "d"),
                 E("bin/hello", data=b"#!/bin/sh\necho hello\n", mode=0o755), E("tmp", "d", mode=0o1777)]
ROOTFS_TOP = [E("etc", "d"), E("etc/motd", data=b"welcome\n"), E("bin", "d"), E("bin/.wh.hello")]
CONFIG_BODY = {"Env": ["PATH=/usr/bin:/bin", "GREETING=hi"], "Cmd": ["/bin/sh"], "WorkingDir": "/work"}


def image_config(diff_ids: list[str], arch: str = "amd64", body: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"architecture": arch, "os": "linux", "config": body or CONFIG_BODY,
                       "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()


def write_docker_archive(path: Path, legacy: bool = True, repo_tag: str = "tiny:1") -> dict[str, Any]:
    """A `docker save` tar: legacy (<id>/layer.tar, <hex>.json) or Docker 25 (blobs/sha256)."""
    bottom, top = make_tar(ROOTFS_BOTTOM), make_tar(ROOTFS_TOP)
    top_gz = gzip.compress(top)  # docker archives may hold gzip layers too
    config = image_config([sha(bottom), sha(top)])
    files: dict[str, bytes] = {}
    if legacy:
        names = ["1111/layer.tar", "2222/layer.tar"]
        config_name = hashlib.sha256(config).hexdigest() + ".json"
    else:
        names = [f"blobs/sha256/{sha(bottom)[7:]}", f"blobs/sha256/{sha(top_gz)[7:]}"]
        config_name = f"blobs/sha256/{sha(config)[7:]}"
    files[names[0]], files[names[1]], files[config_name] = bottom, top_gz, config
    files["manifest.json"] = json.dumps([{"Config": config_name, "RepoTags": [repo_tag], "Layers": names}]).encode()
    with tarfile.open(path, "w") as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return {"config": config, "diff_ids": [sha(bottom), sha(top)]}


def check_tiny_image(store: ImageStore, meta: Any, config: bytes) -> None:
    assert meta.image_id == image_id_for(sha(config)) == "im-" + hashlib.sha256(config).hexdigest()[:24]
    assert meta.kind == "oci" and meta.parent is None
    assert store.exists(meta.image_id) and store.meta(meta.image_id) == meta
    top, bottom = store.layers(meta.image_id)  # top first
    assert (top / "etc/motd").read_bytes() == b"welcome\n"
    assert (bottom / "bin/hello").read_bytes().startswith(b"#!/bin/sh")
    assert stat.S_IMODE(os.lstat(bottom / "bin/hello").st_mode) == 0o755
    if os.geteuid() == 0:
        assert stat.S_ISCHR(os.lstat(top / "bin/hello").st_mode)  # whiteout of the bottom's file
    cfg = meta.image_config
    assert cfg.env_dict() == {"PATH": "/usr/bin:/bin", "GREETING": "hi"}
    assert cfg.cmd == ["/bin/sh"] and cfg.working_dir == "/work" and cfg.entrypoint is None
    assert_store_clean(store, {Path(p).name for p in (top, bottom)} | set())


def forbid_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: Any, **k: Any) -> str:
        raise AssertionError("a layer was unpacked again")
    monkeypatch.setattr(layers_mod, "apply_layer", boom)


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "docker25"])
@needs_root
def test_docker_archive_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, legacy: bool) -> None:
    archive = tmp_path / "tiny.tar"
    info = write_docker_archive(archive, legacy=legacy)
    store = ImageStore(tmp_path / "store")
    meta = import_docker_archive(store, archive)
    check_tiny_image(store, meta, info["config"])
    assert meta.layers == ["sha256-" + d[7:] for d in reversed(info["diff_ids"])]
    assert meta.source == f"docker-archive:{archive}"
    forbid_unpacking(monkeypatch)
    again = import_docker_archive(store, archive, ref="tiny:1")
    assert again == meta
    with pytest.raises(ImageNotFound, match="tiny:1"):
        import_docker_archive(store, archive, ref="other:2")


@needs_root
def test_docker_archive_repeated_layer_is_kept_once(tmp_path: Path) -> None:
    # Legacy `docker save` stores a layer used twice once, the second as a symlink to the first;
    # overlayfs refuses a directory twice in lowerdir, so only the topmost place is kept.
    bottom, top = make_tar(ROOTFS_BOTTOM), make_tar(ROOTFS_TOP)
    config = image_config([sha(bottom), sha(top), sha(bottom)])
    archive = tmp_path / "rep.tar"
    with tarfile.open(archive, "w") as tf:
        for name, data in [("1/layer.tar", bottom), ("2/layer.tar", top), ("c.json", config),
                           ("manifest.json", json.dumps([{"Config": "c.json", "RepoTags": None, "Layers": [
                               "1/layer.tar", "2/layer.tar", "3/layer.tar"]}]).encode())]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        ti = tarfile.TarInfo("3/layer.tar")
        ti.type, ti.linkname = tarfile.SYMTYPE, "../1/layer.tar"
        tf.addfile(ti)
    store = ImageStore(tmp_path / "store")
    meta = import_docker_archive(store, archive)
    assert meta.layers == ["sha256-" + sha(bottom)[7:], "sha256-" + sha(top)[7:]]
    assert (store.layers(meta.image_id)[0] / "bin/hello").is_file()  # the bottom layer, re-applied on top


def test_docker_archive_errors(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageNotFound):
        import_docker_archive(store, tmp_path / "missing.tar")
    (tmp_path / "junk.tar").write_bytes(b"not a tar" * 100)
    with pytest.raises(ImageCorrupt):
        import_docker_archive(store, tmp_path / "junk.tar")
    archive = tmp_path / "tiny.tar"
    write_docker_archive(archive)
    data = archive.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 3])
    with pytest.raises(ImageCorrupt):
        import_docker_archive(store, tmp_path / "cut.tar")
    assert store.list() == []
    assert not list((store.root / "_layers").glob(".tmp-*"))


@dataclass
class Layout:
    path: Path
    config: bytes
    manifest: bytes
    diff_ids: list[str]
    blobs: dict[str, bytes]


def write_oci_layout(path: Path, ref: str = "v1", compression: str = "gzip", arch_index: bool = False) -> Layout:
    """An OCI image layout directory with the tiny image; `arch_index`: index.json names an
    image index with an arm64 and an amd64 manifest (as multi-platform images do)."""
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> str:
        blobs[sha(data)] = data
        return sha(data)

    raw = [make_tar(ROOTFS_BOTTOM), make_tar(ROOTFS_TOP)]
    packed = [gzip.compress(r) if compression == "gzip" else zstd_compress(r) if compression == "zstd" else r
              for r in raw]
    media = {"gzip": OCI_LAYER_GZIP, "zstd": OCI_LAYER_ZSTD, "": OCI_LAYER_TAR}[compression]
    config = image_config([sha(r) for r in raw])

    def manifest_for(cfg: bytes, layer_blobs: list[bytes]) -> bytes:
        return json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": add(cfg), "size": len(cfg)},
            "layers": [{"mediaType": media, "digest": add(b), "size": len(b)} for b in layer_blobs]}).encode()

    manifest = manifest_for(config, packed)
    top: dict[str, Any] = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": add(manifest),
                           "size": len(manifest)}
    if arch_index:
        other = manifest_for(image_config([sha(raw[0])], arch="arm64"), packed[:1])
        index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": add(other), "size": len(other),
             "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {**top, "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
        top = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": add(index), "size": len(index)}
    top["annotations"] = {"org.opencontainers.image.ref.name": ref}
    (path / "blobs/sha256").mkdir(parents=True)
    for d, b in blobs.items():
        (path / "blobs/sha256" / d[7:]).write_bytes(b)
    (path / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return Layout(path, config, manifest, [sha(r) for r in raw], blobs)


@needs_root
@pytest.mark.parametrize("compression", ["gzip", "zstd", ""])
def test_oci_layout_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: str) -> None:
    lay = write_oci_layout(tmp_path / "layout", compression=compression)
    store = ImageStore(tmp_path / "store")
    meta = import_oci_layout(store, lay.path, ref="v1")
    check_tiny_image(store, meta, lay.config)
    assert meta.source == f"oci-layout:{lay.path}"
    forbid_unpacking(monkeypatch)
    assert import_oci_layout(store, lay.path) == meta


@needs_root
def test_oci_layout_tar_and_platform_index(tmp_path: Path) -> None:
    lay = write_oci_layout(tmp_path / "layout", ref="multi", arch_index=True)
    tar_path = tmp_path / "layout.tar"
    with tarfile.open(tar_path, "w") as tf:
        tf.add(lay.path, arcname="layout")  # a tar of the directory itself
    store = ImageStore(tmp_path / "store")
    meta = import_oci_layout(store, tar_path, ref="multi")
    check_tiny_image(store, meta, lay.config)  # the amd64 manifest, not the arm64 one
    with pytest.raises(ImageNotFound, match="multi"):
        import_oci_layout(store, tar_path, ref="nope")
    # A Docker 25 `docker save` is an OCI layout too: import_docker_archive takes it.
    assert import_docker_archive(store, tar_path) == meta


def test_oci_layout_errors_leave_store_clean(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageNotFound):
        import_oci_layout(store, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsupportedImage, match="oci-layout"):
        import_oci_layout(store, tmp_path / "empty")
    lay = write_oci_layout(tmp_path / "layout")
    layer_digest = json.loads(lay.manifest)["layers"][1]["digest"]
    blob_path = lay.path / "blobs/sha256" / layer_digest[7:]
    good = blob_path.read_bytes()
    blob_path.write_bytes(good[:10] + bytes([good[10] ^ 0xFF]) + good[11:])
    with pytest.raises(ImageCorrupt):
        import_oci_layout(store, lay.path)
    assert store.list() == []
    # The bottom layer was fine and may stay (complete, shared); no staging, no image.
    assert_store_clean(store, {"sha256-" + lay.diff_ids[0][7:]})
    blob_path.unlink()
    with pytest.raises(ImageCorrupt, match="missing"):
        import_oci_layout(store, lay.path)
    blob_path.write_bytes(good)
    if os.geteuid() == 0:
        assert import_oci_layout(store, lay.path).layers == ["sha256-" + d[7:] for d in reversed(lay.diff_ids)]
    (lay.path / "index.json").write_text("{not json")
    with pytest.raises(ImageCorrupt, match="JSON"):
        import_oci_layout(store, lay.path)


def test_oci_layout_without_this_platform(tmp_path: Path) -> None:
    lay = write_oci_layout(tmp_path / "layout", arch_index=True)
    index_digest = json.loads((lay.path / "index.json").read_text())["manifests"][0]["digest"]
    index = json.loads(lay.blobs[index_digest])
    index["manifests"] = index["manifests"][:1]  # arm64 only
    data = json.dumps(index).encode()
    (lay.path / "blobs/sha256" / sha(data)[7:]).write_bytes(data)
    (lay.path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": sha(data), "size": len(data)}]}))
    with pytest.raises(UnsupportedImage, match="linux/arm64/v8"):
        import_oci_layout(ImageStore(tmp_path / "store"), lay.path)


# ---- references ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ref, want", [
    ("debian", Reference("registry-1.docker.io", "library/debian", "latest")),
    ("debian:12", Reference("registry-1.docker.io", "library/debian", "12")),
    ("docker.io/org/app:v1", Reference("registry-1.docker.io", "org/app", "v1")),
    ("org/app", Reference("registry-1.docker.io", "org/app", "latest")),
    ("ghcr.io/org/team/app:1.2.3", Reference("ghcr.io", "org/team/app", "1.2.3")),
    ("localhost/app", Reference("localhost", "app", "latest")),
    ("localhost:5000/test/img:tag", Reference("localhost:5000", "test/img", "tag")),
    ("127.0.0.1:5000/test/img", Reference("127.0.0.1:5000", "test/img", "latest")),
    ("quay.io/a/b@sha256:" + "a" * 64, Reference("quay.io", "a/b", None, "sha256:" + "a" * 64)),
    ("quay.io/a/b:t@sha256:" + "b" * 64, Reference("quay.io", "a/b", "t", "sha256:" + "b" * 64)),
])
def test_parse_reference(ref: str, want: Reference) -> None:
    assert parse_reference(ref) == want


@pytest.mark.parametrize("ref", ["", " debian", "Debian", "a//b", "a:b:c", "debian@sha256:xyz", "debian:",
                                 "../etc", "host:99999999/x", "a b", "debian:-bad"])
def test_bad_references(ref: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_reference(ref)


def test_loopback_speaks_http() -> None:
    assert parse_reference("127.0.0.1:5000/a").is_loopback
    assert parse_reference("localhost/a").is_loopback
    assert not parse_reference("example.com/a").is_loopback


# ---- the registry client, against an in-memory registry --------------------------------------------

class FakeRegistry:
    """Serves one repository (manifests by tag or digest, blobs) behind Docker-style token auth."""

    def __init__(self, repo: str, lay: Layout, *, auth: str = "bearer", user: tuple[str, str] = ("u", "p")) -> None:
        self.repo, self.auth, self.user = repo, auth, user
        self.blobs = dict(lay.blobs)
        index = json.loads((lay.path / "index.json").read_text())["manifests"][0]
        self.tags = {"v1": index["digest"]}
        self.requests: list[httpx.Request] = []
        self.fail_next: list[int] = []  # statuses to answer before serving
        self.cut_blob: str | None = None  # a blob whose first download is interrupted

    def handler(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        if req.url.host == "auth.example":
            if req.headers.get("Authorization") != "Basic " + registry_mod._basic(self.user):
                return httpx.Response(401)
            return httpx.Response(200, json={"token": "T0K3N"})
        if self.fail_next:
            return httpx.Response(self.fail_next.pop(0))
        want = "Bearer T0K3N" if self.auth == "bearer" else "Basic " + registry_mod._basic(self.user)
        if req.headers.get("Authorization") != want:
            challenge = ('Bearer realm="https://auth.example/token",service="fake",'
                         f'scope="repository:{self.repo}:pull"' if self.auth == "bearer" else 'Basic realm="fake"')
            return httpx.Response(401, headers={"WWW-Authenticate": challenge},
                                  json={"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]})
        path = req.url.path
        prefix = f"/v2/{self.repo}/"
        if not path.startswith(prefix):
            return httpx.Response(404, json={"errors": [{"code": "NAME_UNKNOWN", "message": "repository name not known"}]})
        kind, _, ref = path[len(prefix):].partition("/")
        digest = self.tags.get(ref, ref)
        if kind == "manifests":
            assert "application/vnd.oci.image.index.v1+json" in req.headers["Accept"]
            if digest not in self.blobs:
                return httpx.Response(404, json={"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]})
            body = self.blobs[digest]
            return httpx.Response(200, content=body, headers={"Content-Type": json.loads(body)["mediaType"],
                                                              "Docker-Content-Digest": digest})
        if digest not in self.blobs:
            return httpx.Response(404, json={"errors": [{"code": "BLOB_UNKNOWN", "message": "blob unknown"}]})
        body = self.blobs[digest]
        rng = req.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].rstrip("-"))
            return httpx.Response(206, content=body[start:])
        if digest == self.cut_blob:
            self.cut_blob = None
            return httpx.Response(200, stream=CutStream(body[: len(body) // 2]),
                                  headers={"Content-Length": str(len(body))})
        return httpx.Response(200, content=body)


class CutStream(httpx.SyncByteStream):
    """A response body that breaks off halfway, as a dropped connection does."""

    def __init__(self, part: bytes) -> None:
        self.part = part

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.part
        raise httpx.ReadError("connection reset by peer")


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_mod, "RETRY_DELAYS", (0.0, 0.0, 0.0))


@needs_root
def test_pull_with_token_auth_index_retries_and_resume(tmp_path: Path, no_backoff: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    lay = write_oci_layout(tmp_path / "layout", arch_index=True)
    reg = FakeRegistry("org/tiny", lay)
    reg.fail_next = [503]  # a flaky registry: retried
    reg.cut_blob = json.loads(lay.manifest)["layers"][0]["digest"]  # resumed with a Range request
    store = ImageStore(tmp_path / "store")
    meta = pull(store, "reg.example/org/tiny:v1", credentials=("u", "p"), transport=httpx.MockTransport(reg.handler))
    check_tiny_image(store, meta, lay.config)
    assert meta.source == "registry:reg.example/org/tiny:v1"
    assert all(r.url.scheme == "https" for r in reg.requests)
    assert any(r.headers.get("Range") for r in reg.requests)
    # Again: only the manifests are fetched, nothing is downloaded or unpacked.
    forbid_unpacking(monkeypatch)
    reg.requests.clear()
    assert pull(store, "reg.example/org/tiny:v1", credentials=("u", "p"),
                transport=httpx.MockTransport(reg.handler)) == meta
    assert not [r for r in reg.requests if "/blobs/" in r.url.path]


def test_pull_errors(tmp_path: Path, no_backoff: None) -> None:
    lay = write_oci_layout(tmp_path / "layout")
    reg = FakeRegistry("org/tiny", lay)
    store = ImageStore(tmp_path / "store")
    t = httpx.MockTransport(reg.handler)
    with pytest.raises(ImageNotFound, match="no tag or digest 'v2'"):
        pull(store, "reg.example/org/tiny:v2", credentials=("u", "p"), transport=t)
    with pytest.raises(ImageNotFound, match="repository org/other not found"):
        pull(store, "reg.example/org/other:v1", credentials=("u", "p"), transport=t)
    with pytest.raises(ImagePullError, match="refused user 'u'"):
        pull(store, "reg.example/org/tiny:v1", credentials=("u", "wrong"), transport=t)
    reg.fail_next = [500] * 10
    with pytest.raises(ImagePullError, match="HTTP 500"):
        pull(store, "reg.example/org/tiny:v1", credentials=("u", "p"), transport=t)
    reg.fail_next = []
    basic = FakeRegistry("org/tiny", lay, auth="basic")
    with pytest.raises(ImagePullError, match="requires credentials"):
        pull(store, "reg.example/org/tiny:v1", transport=httpx.MockTransport(basic.handler))
    with pytest.raises(ImagePullError, match="authentication to reg.example failed"):
        pull(store, "reg.example/org/tiny:v1", credentials=("u", "bad"), transport=httpx.MockTransport(basic.handler))
    # A layer blob the registry serves corrupted: ImageCorrupt, nothing half-written.
    layer = json.loads(lay.manifest)["layers"][1]["digest"]
    good = reg.blobs[layer]
    reg.blobs[layer] = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(ImageCorrupt, match="does not match its digest"):
        pull(store, "reg.example/org/tiny:v1", credentials=("u", "p"), transport=t)
    assert store.list() == []
    assert not [p for p in (store.root / "_layers").iterdir() if p.name.startswith(".tmp-")]


def test_pull_tries_once_plus_one_retry_per_delay(tmp_path: Path, no_backoff: None) -> None:
    """RETRY_DELAYS has 3 entries here: a 5xx is tried 4 times in all, never a fifth."""
    reg = FakeRegistry("org/tiny", write_oci_layout(tmp_path / "layout"))
    store = ImageStore(tmp_path / "store")
    t = httpx.MockTransport(reg.handler)
    reg.fail_next = [503] * 5
    with pytest.raises(ImagePullError, match="HTTP 503 .* after 4 tries"):
        pull(store, "reg.example/org/tiny:v1", credentials=("u", "p"), transport=t)
    assert reg.fail_next == [503]
    reg.fail_next = [503] * 3  # the fourth try is answered: a missing tag, not a retry
    with pytest.raises(ImageNotFound, match="no tag or digest 'v2'"):
        pull(store, "reg.example/org/tiny:v2", credentials=("u", "p"), transport=t)
    assert reg.fail_next == []


def test_pull_refuses_schema1_and_foreign_layers(tmp_path: Path, no_backoff: None) -> None:
    lay = write_oci_layout(tmp_path / "layout")
    reg = FakeRegistry("org/tiny", lay)
    store = ImageStore(tmp_path / "store")
    t = httpx.MockTransport(reg.handler)
    v1 = json.dumps({"schemaVersion": 1, "mediaType": "application/vnd.docker.distribution.manifest.v1+prettyjws",
                     "name": "org/tiny", "fsLayers": []}).encode()
    reg.blobs[sha(v1)], reg.tags["old"] = v1, sha(v1)
    with pytest.raises(UnsupportedImage, match="schema 1"):
        pull(store, "reg.example/org/tiny:old", credentials=("u", "p"), transport=t)
    m = json.loads(lay.manifest)
    m["layers"][0]["mediaType"] = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
    data = json.dumps(m).encode()
    reg.blobs[sha(data)], reg.tags["win"] = data, sha(data)
    with pytest.raises(UnsupportedImage, match="foreign"):
        pull(store, "reg.example/org/tiny:win", credentials=("u", "p"), transport=t)
    assert_store_clean(store)
