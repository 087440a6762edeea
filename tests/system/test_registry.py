"""Pulling from a real Docker registry (distribution 2.8) on loopback, pushed to with skopeo.

Needs root and the Debian packages docker-registry, skopeo and apache2-utils (htpasswd):
    apt-get install -y docker-registry skopeo apache2-utils
The module installs them when missing, or skips with the reason. Each registry listens on
127.0.0.1 with its storage under tmp_path and is stopped at teardown; images are tiny.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.errors import ImageCorrupt, ImageNotFound, ImagePullError
from rollbox.images import layers as layers_mod
from rollbox.images import registry as registry_mod
from rollbox.images.registry import pull
from rollbox.images.store import ImageStore

pytestmark = pytest.mark.system

if os.geteuid() != 0:
    pytest.skip("registry tests need root (image layers hold whiteout device nodes)", allow_module_level=True)

PACKAGES = {"docker-registry": "docker-registry", "skopeo": "skopeo", "htpasswd": "apache2-utils"}


def _ensure_tools() -> None:
    missing = sorted({pkg for exe, pkg in PACKAGES.items() if shutil.which(exe) is None})
    if missing:
        res = subprocess.run(["apt-get", "install", "-y", *missing], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        still = [exe for exe in PACKAGES if shutil.which(exe) is None]
        if still:
            pytest.skip(f"registry tests need {', '.join(still)} (`apt-get install -y {' '.join(missing)}` "
                        f"failed: {res.stderr.strip()[-300:]})", allow_module_level=True)


_ensure_tools()


# ---- a tiny image as an OCI layout ------------------------------------------------------------

def _tar(entries: list[tuple[str, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_600_000_000
            if data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o755 if name.startswith("bin/") else 0o644
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class TinyImage:
    layout: Path
    config_digest: str
    diff_ids: list[str]  # bottom first
    layer_digests: list[str]  # compressed, bottom first
    manifest_digest: str


def write_layout(path: Path) -> TinyImage:
    """An OCI layout with one image tagged "v1" and a two-platform index tagged "multi"."""
    bottom = _tar([("etc", None), ("etc/os-release", b"ID=tiny\n"), ("bin", None), ("bin/hello", b"#!/bin/sh\n"),
                   ("big", os.urandom(200_000))])
    top = _tar([("etc", None), ("etc/motd", b"welcome\n"), (".wh.big", b"")])
    raw = [bottom, top]
    packed = [gzip.compress(r, mtime=0) for r in raw]
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> dict[str, Any]:
        blobs[_sha(data)] = data
        return {"digest": _sha(data), "size": len(data)}

    def manifest(arch: str, layer_count: int) -> bytes:
        config = json.dumps({"architecture": arch, "os": "linux",
                             "config": {"Env": ["GREETING=hi"], "Cmd": ["/bin/hello"], "WorkingDir": "/"},
                             "rootfs": {"type": "layers", "diff_ids": [_sha(r) for r in raw[:layer_count]]}}).encode()
        return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **add(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **add(p)}
                                      for p in packed[:layer_count]]}).encode()

    amd64, arm64 = manifest("amd64", 2), manifest("arm64", 1)
    mt = "application/vnd.oci.image.manifest.v1+json"
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": mt, **add(arm64), "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": mt, **add(amd64), "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    tops = [{"mediaType": mt, **add(amd64), "annotations": {"org.opencontainers.image.ref.name": "v1"}},
            {"mediaType": "application/vnd.oci.image.index.v1+json", **add(index),
             "annotations": {"org.opencontainers.image.ref.name": "multi"}}]
    (path / "blobs/sha256").mkdir(parents=True)
    for d, b in blobs.items():
        (path / "blobs/sha256" / d[7:]).write_bytes(b)
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": tops}))
    m = json.loads(amd64)
    return TinyImage(path, m["config"]["digest"], [_sha(r) for r in raw], [ly["digest"] for ly in m["layers"]],
                     _sha(amd64))


# ---- a registry on loopback ---------------------------------------------------------------------

@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    storage: Path
    creds: tuple[str, str] | None

    def blob_file(self, digest: str) -> Path:
        hexpart = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexpart[:2] / hexpart / "data"

    def push(self, image: TinyImage, tag: str, repo: str = "test/img") -> None:
        cmd = ["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false", "--preserve-digests"]
        if tag == "multi":
            cmd.append("--all")
        if self.creds:
            cmd += ["--dest-creds", ":".join(self.creds)]
        res = subprocess.run([*cmd, f"oci:{image.layout}:{tag}", f"docker://{self.host}/{repo}:{tag}"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"skopeo copy failed: {res.stderr}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyImage:
    return write_layout(tmp_path_factory.mktemp("layout") / "oci")


@contextmanager
def _start_registry(base: Path, creds: tuple[str, str] | None) -> Iterator[Registry]:
    port = _free_port()
    storage = base / "storage"
    config = (f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n"
              f"http:\n  addr: 127.0.0.1:{port}\n")
    if creds:
        htpasswd = base / "htpasswd"
        subprocess.run(["htpasswd", "-Bbc", str(htpasswd), *creds], check=True, capture_output=True)
        config += f"auth:\n  htpasswd:\n    realm: rollbox-test\n    path: {htpasswd}\n"
    (base / "config.yml").write_text(config)
    log = open(base / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(base / "config.yml")], stdout=log, stderr=log,
                            env={k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")})
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code in (200, 401):
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"docker-registry did not start: {(base / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", storage, creds)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, tiny: TinyImage) -> Iterator[Registry]:
    """No auth; holds test/img:v1 and test/img:multi (an index: arm64 + amd64)."""
    with _start_registry(tmp_path_factory.mktemp("registry"), None) as reg:
        reg.push(tiny, "v1")
        reg.push(tiny, "multi")
        yield reg


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory, tiny: TinyImage) -> Iterator[Registry]:
    """HTTP Basic auth (htpasswd, bcrypt); holds private/img:v1."""
    with _start_registry(tmp_path_factory.mktemp("auth-registry"), ("alice", "s3cret")) as reg:
        reg.push(tiny, "v1", repo="private/img")
        yield reg


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_mod, "RETRY_DELAYS", (0.05, 0.1))


def assert_clean(store: ImageStore) -> None:
    base = store.root / "_layers"
    assert not list(base.glob(".tmp-*")) if base.exists() else True
    assert store.list() == []


def check_pulled(store: ImageStore, meta: Any, tiny: TinyImage) -> None:
    assert meta.image_id == "im-" + tiny.config_digest[7:31]
    assert meta.layers == ["sha256-" + d[7:] for d in reversed(tiny.diff_ids)]
    assert store.meta(meta.image_id) == meta and store.exists(meta.image_id)
    top, bottom = store.layers(meta.image_id)
    assert (top / "etc/motd").read_bytes() == b"welcome\n"
    assert os.lstat(top / "big").st_rdev == os.makedev(0, 0)  # the whiteout, in overlayfs form
    assert (bottom / "etc/os-release").read_bytes() == b"ID=tiny\n"
    assert os.stat(bottom / "bin/hello").st_mode & 0o777 == 0o755
    assert meta.image_config.env_dict() == {"GREETING": "hi"} and meta.image_config.cmd == ["/bin/hello"]
    assert not list((store.root / "_layers").glob(".tmp-*"))


# ---- tests ----------------------------------------------------------------------------------------------

def test_pull_tag_then_again_is_a_no_op(tmp_path: Path, registry: Registry, tiny: TinyImage,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = ImageStore(tmp_path / "images")
    meta = pull(store, f"{registry.host}/test/img:v1")
    check_pulled(store, meta, tiny)
    assert meta.source == f"registry:{registry.host}/test/img:v1"

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("pulled an image that is already in the store")
    monkeypatch.setattr(layers_mod, "store_layer", boom)
    monkeypatch.setattr(registry_mod.RegistryClient, "download_blob", boom)
    assert pull(store, f"{registry.host}/test/img:v1") == meta
    # The index picks linux/amd64: the same image, so nothing is fetched either.
    assert pull(store, f"{registry.host}/test/img:multi") == meta
    assert pull(store, f"{registry.host}/test/img@{tiny.manifest_digest}") == meta


def test_pull_multi_platform_index(tmp_path: Path, registry: Registry, tiny: TinyImage) -> None:
    store = ImageStore(tmp_path / "images")
    check_pulled(store, pull(store, f"{registry.host}/test/img:multi"), tiny)


def test_unknown_tag_and_repository(tmp_path: Path, registry: Registry) -> None:
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ImageNotFound, match="no tag or digest 'nope'"):
        pull(store, f"{registry.host}/test/img:nope")
    with pytest.raises(ImageNotFound, match="test/absent"):
        pull(store, f"{registry.host}/test/absent:v1")
    assert_clean(store)


def test_registry_down(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    port = _free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ImagePullError, match=f"cannot reach registry 127.0.0.1:{port}") as ei:
        pull(store, f"127.0.0.1:{port}/test/img:v1")
    assert "running and reachable" in str(ei.value) and time.monotonic() - t0 < 10
    assert_clean(store)


def test_corrupt_blob_on_registry_then_retry(tmp_path: Path, registry: Registry, tiny: TinyImage) -> None:
    blob = registry.blob_file(tiny.layer_digests[0])  # the bottom layer (the big one)
    good = blob.read_bytes()
    store = ImageStore(tmp_path / "images")
    try:
        blob.write_bytes(good[:100] + bytes([good[100] ^ 0xFF]) + good[101:])
        with pytest.raises(ImageCorrupt, match="does not match its digest") as ei:
            pull(store, f"{registry.host}/test/img:v1")
        assert tiny.layer_digests[0] in str(ei.value)
        assert_clean(store)
        assert not (store.root / "_layers" / ("sha256-" + tiny.diff_ids[0][7:])).exists()
    finally:
        blob.write_bytes(good)
    check_pulled(store, pull(store, f"{registry.host}/test/img:v1"), tiny)


def test_basic_auth(tmp_path: Path, auth_registry: Registry, tiny: TinyImage) -> None:
    store = ImageStore(tmp_path / "images")
    ref = f"{auth_registry.host}/private/img:v1"
    with pytest.raises(ImagePullError, match="requires credentials"):
        pull(store, ref)
    with pytest.raises(ImagePullError, match="authentication to .* failed"):
        pull(store, ref, credentials=("alice", "wrong"))
    assert_clean(store)
    check_pulled(store, pull(store, ref, credentials=("alice", "s3cret")), tiny)
