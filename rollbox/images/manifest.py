"""OCI image manifests, indexes, descriptors and configs: parsing and checking what a registry
or an archive says an image is (OCI image-spec v1.1, https://github.com/opencontainers/image-spec:
manifest.md, image-index.md, config.md, descriptor.md, media-types.md; Docker's image manifest
v2 schema 2). layers.py applies the layer blobs they name.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ImageCorrupt, UnsupportedImage

# ---- media types (image-spec media-types.md; Docker's image manifest v2 schema 2) -------------

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
CONFIG_TYPES = (OCI_CONFIG, DOCKER_CONFIG)
# Layer media type -> compression ("" = none).
LAYER_TYPES = {OCI_LAYER_TAR: "", OCI_LAYER_GZIP: "gzip", OCI_LAYER_ZSTD: "zstd", DOCKER_LAYER_GZIP: "gzip"}

ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
MAX_JSON_BYTES = 8 << 20  # manifests and configs; distribution caps manifests at 4 MiB
# xattrs a layer may carry (PAX SCHILY.xattr.*): never trusted.*, which overlayfs obeys
# (trusted.overlay.redirect could point a file at another path).

_DIGEST_RE = {"sha256": re.compile(r"[a-f0-9]{64}"), "sha512": re.compile(r"[a-f0-9]{128}")}


# ---- digests (descriptor.md "Digests") -----------------------------------------------------

def split_digest(digest: object, what: str) -> tuple[str, str]:
    """`"sha256:<hex>"` -> ("sha256", hex). Only the registered sha256/sha512 are accepted,
    with lowercase hex, so a digest is always safe in a path or URL.

    Raises ImageCorrupt (malformed) or UnsupportedImage (another algorithm).
    """
    algo, sep, hexpart = digest.partition(":") if isinstance(digest, str) else ("", "", "")
    if not sep or not re.fullmatch(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*", algo):
        raise ImageCorrupt(f"{what}: {digest!r} is not a digest (expected 'sha256:<64 hex>'); "
                           "the image is malformed: rebuild or re-export it")
    pattern = _DIGEST_RE.get(algo)
    if pattern is None:
        raise UnsupportedImage(f"{what}: digest algorithm {algo!r} is not supported (only sha256, sha512)")
    if not pattern.fullmatch(hexpart):
        raise ImageCorrupt(f"{what}: {digest!r} is not a valid {algo} digest; the image is malformed")
    return algo, hexpart


def verify_bytes(data: bytes, digest: str, what: str) -> None:
    """Raises ImageCorrupt unless `data` hashes to `digest`."""
    algo, hexpart = split_digest(digest, what)
    got = hashlib.new(algo, data).hexdigest()
    if got != hexpart:
        raise ImageCorrupt(f"{what}: content does not match its digest {digest} (got {algo}:{got}); "
                           "the copy is corrupt: fetch or export the image again")


def layer_key(diff_id: str) -> str:
    """The image store key of a layer: "sha256-<hex of its uncompressed diff_id>"."""
    algo, hexpart = split_digest(diff_id, "layer diff_id")
    return f"{algo}-{hexpart}"


def image_id_for(config_digest: str) -> str:
    """An imported image's id: "im-" + the first 24 hex digits of its config digest, so the
    same image imported twice (from anywhere) is the same image."""
    return "im-" + split_digest(config_digest, "image config")[1][:24]


# ---- manifests, indexes, configs -------------------------------------------------------------

@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor (descriptor.md): what a blob is, its digest and size in bytes."""

    media_type: str
    digest: str
    size: int
    platform: dict[str, Any] | None = None
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def platform_name(self) -> str:
        p = self.platform or {}
        name = f"{p.get('os', '?')}/{p.get('architecture', '?')}"
        return name + (f"/{p['variant']}" if p.get("variant") else "")


@dataclass(frozen=True)
class Manifest:
    """An image manifest (manifest.md): a config and layers, bottom layer first."""

    config: Descriptor
    layers: list[Descriptor]


def parse_json(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object, or ImageCorrupt naming `what`."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ImageCorrupt(f"{what} is not valid JSON ({e}); the image is malformed or truncated: "
                           "fetch or export it again") from None
    if not isinstance(obj, dict):
        raise ImageCorrupt(f"{what} is not a JSON object; the image is malformed")
    return obj


def parse_descriptor(obj: Any, what: str) -> Descriptor:
    if not isinstance(obj, dict):
        raise ImageCorrupt(f"{what}: a descriptor must be a JSON object; the image is malformed")
    mt, digest, size = obj.get("mediaType"), obj.get("digest"), obj.get("size")
    if not isinstance(mt, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageCorrupt(f"{what}: descriptor lacks a mediaType or a size; the image is malformed")
    split_digest(digest, what)
    plat = obj.get("platform")
    ann = obj.get("annotations") or {}
    return Descriptor(mt, str(digest), size, plat if isinstance(plat, dict) else None,
                      {str(k): str(v) for k, v in ann.items()} if isinstance(ann, dict) else {})


def manifest_kind(obj: dict[str, Any], media_type: str | None) -> str:
    """"index" or "manifest" for a parsed manifest JSON; the body's mediaType wins over the
    transport's (Content-Type), and a body without one is recognised by its fields."""
    mt = obj.get("mediaType") or media_type or ""
    if mt in INDEX_TYPES or (not mt and "manifests" in obj):
        return "index"
    if mt in MANIFEST_TYPES or (not mt and "layers" in obj):
        return "manifest"
    if "distribution.manifest.v1" in mt or obj.get("schemaVersion") == 1:
        raise UnsupportedImage(f"image manifest schema 1 ({mt or 'schemaVersion 1'}) is deprecated and not "
                               "supported: push the image again with a current docker or skopeo")
    raise UnsupportedImage(f"manifest media type {mt!r} is not a container image (expected one of "
                           f"{', '.join(INDEX_TYPES + MANIFEST_TYPES)})")


def parse_index(obj: dict[str, Any], what: str) -> list[Descriptor]:
    """The manifests an image index (image-index.md) or Docker manifest list names."""
    ms = obj.get("manifests")
    if not isinstance(ms, list):
        raise ImageCorrupt(f"{what}: image index has no 'manifests' list; the image is malformed")
    return [parse_descriptor(m, f"{what} manifests[{i}]") for i, m in enumerate(ms)]


def parse_manifest(obj: dict[str, Any], what: str) -> Manifest:
    """An image manifest; checks now that rollbox can use its config and every layer, so an
    unusable image fails before anything is downloaded. Raises ImageCorrupt, UnsupportedImage."""
    config = parse_descriptor(obj.get("config"), f"{what} config")
    if config.media_type not in CONFIG_TYPES:
        raise UnsupportedImage(f"{what} is not a container image: its config media type is "
                               f"{config.media_type!r} (expected {' or '.join(CONFIG_TYPES)})")
    raw = obj.get("layers")
    if not isinstance(raw, list):
        raise ImageCorrupt(f"{what}: manifest has no 'layers' list; the image is malformed")
    layers = [parse_descriptor(d, f"{what} layers[{i}]") for i, d in enumerate(raw)]
    if not layers:
        raise UnsupportedImage(f"{what} has no layers: rollbox boots images with at least one layer")
    for d in layers:
        check_layer_media_type(d.media_type, f"layer {d.digest} of {what}")
    return Manifest(config, layers)


def check_layer_media_type(media_type: str, what: str) -> str:
    """The compression of a layer media type ("", "gzip", "zstd"), or UnsupportedImage."""
    if media_type in LAYER_TYPES:
        return LAYER_TYPES[media_type]
    if "foreign" in media_type or "nondistributable" in media_type:
        raise UnsupportedImage(f"{what} is a foreign (non-distributable) layer ({media_type}) whose content "
                               "lives outside the image: rollbox cannot fetch it; use a Linux image")
    raise UnsupportedImage(f"{what} has media type {media_type!r}, which rollbox cannot unpack "
                           f"(supported: {', '.join(LAYER_TYPES)})")


def host_platform() -> tuple[str, str]:
    """("linux", GOARCH of this host): the platform picked from an index."""
    machine = platform.machine().lower()
    return "linux", {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def pick_platform(manifests: Sequence[Descriptor], what: str) -> Descriptor:
    """The manifest for this host's platform (linux/amd64 on x86-64) from an index's list;
    attestation manifests (platform unknown/unknown) are never picked. Raises UnsupportedImage
    listing the platforms there are."""
    want_os, want_arch = host_platform()
    for d in manifests:
        p = d.platform or {}
        if p.get("os") == want_os and p.get("architecture") == want_arch and d.media_type not in INDEX_TYPES:
            return d
    have = sorted({d.platform_name for d in manifests if d.platform}) or ["none declared"]
    raise UnsupportedImage(f"{what} has no {want_os}/{want_arch} image (it has: {', '.join(have)}): "
                           f"use an image built for {want_os}/{want_arch}")


@dataclass(frozen=True)
class ParsedConfig:
    """What rollbox takes from an image config (config.md)."""

    config: dict[str, Any]  # the "config" object: Env, Cmd, Entrypoint, WorkingDir, User
    diff_ids: list[str]  # uncompressed layer digests, bottom first


def parse_config(data: bytes, what: str) -> ParsedConfig:
    """Parses an image config; raises ImageCorrupt (malformed) or UnsupportedImage (not a
    Linux image for this host's architecture)."""
    obj = parse_json(data, what)
    want_os, want_arch = host_platform()
    if obj.get("os") not in (None, want_os):
        raise UnsupportedImage(f"{what} is a {obj.get('os')} image: rollbox runs {want_os} images only")
    if obj.get("architecture") not in (None, want_arch):
        raise UnsupportedImage(f"{what} is built for {obj.get('architecture')}, not {want_arch}: "
                               f"pull or build the {want_os}/{want_arch} variant")
    rootfs = obj.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers" or not isinstance(rootfs.get("diff_ids"), list):
        raise ImageCorrupt(f"{what}: config lacks rootfs.type 'layers' and rootfs.diff_ids; the image is malformed")
    diff_ids = list(rootfs["diff_ids"])
    for d in diff_ids:
        split_digest(d, f"{what} rootfs.diff_ids")
    cfg = obj.get("config")
    if cfg is not None and not isinstance(cfg, dict):
        raise ImageCorrupt(f"{what}: 'config' is not a JSON object; the image is malformed")
    for k in ("Env", "Entrypoint", "Cmd"):
        v = (cfg or {}).get(k)
        if v is not None and not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
            raise ImageCorrupt(f"{what}: config.{k} is not a list of strings; the image is malformed")
    return ParsedConfig(cfg or {}, diff_ids)
