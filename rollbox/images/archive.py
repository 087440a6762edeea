"""Importing images from files: `docker save` archives and OCI image layouts.

- A `docker save` archive (https://github.com/moby/docker-image-spec/blob/main/spec.md,
  "Combined Image JSON + Filesystem Changeset Format") is a tar whose manifest.json lists, per
  image, its Config file and its Layers (each "<id>/layer.tar", plain or gzip, or, since Docker
  25, "blobs/sha256/<hex>"); the config's rootfs.diff_ids give the layers' digests.
- An OCI image layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md)
  is a directory, or a tar of one, with an `oci-layout` file, `index.json` and
  `blobs/<alg>/<hex>`; an image is picked by its `org.opencontainers.image.ref.name`
  annotation, or else the first one for this host's platform (linux/amd64 on x86-64).

Every blob is verified against its digest while read, layers are unpacked by layers.py, and
importing the same image twice returns the stored image without unpacking anything.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import posixpath
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import ImageCorrupt, ImageNotFound, UnsupportedImage
from .layers import LayerBlob, import_image
from .manifest import (ANNOTATION_REF_NAME, MAX_JSON_BYTES, Descriptor, Manifest, check_layer_media_type,
                       host_platform, manifest_kind, parse_index, parse_json, parse_manifest, split_digest,
                       verify_bytes)
from .store import ImageMeta, ImageStore

MAX_INDEX_DEPTH = 4
_BLOB_NAME = re.compile(r"blobs/(sha256|sha512)/([a-f0-9]+)")
_LEGACY_CONFIG = re.compile(r"([a-f0-9]{64})\.json")
_CONTAINERD_NAME = "io.containerd.image.name"


def import_docker_archive(store: ImageStore, path: str | os.PathLike[str], ref: str | None = None) -> ImageMeta:
    """Imports the image a `docker save` tar holds (also a gzip-compressed one, or the
    directory it unpacks to) and returns its ImageMeta.

    ref: which image when the archive holds several ("repo:tag" as in its RepoTags); by
      default the first. An archive that is an OCI layout (no manifest.json) is imported as one.

    Raises ImageNotFound (no such file; no image tagged `ref`), ImageCorrupt (not a tar,
    truncated, malformed JSON, digest mismatch), UnsupportedImage (not a docker archive,
    foreign layers, another platform), ResourceExhausted.
    """
    p = Path(path)
    with _open_source(p, "docker archive") as src:
        if not src.has("manifest.json"):
            if src.has("oci-layout"):
                return _import_layout(store, src, ref, f"docker-archive:{p}")
            raise UnsupportedImage(f"{p} has no manifest.json: it is not a `docker save` archive "
                                   "(create one with `docker save -o FILE IMAGE`)")
        try:
            entries = json.loads(src.read("manifest.json"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ImageCorrupt(f"manifest.json of {p} is not valid JSON ({e}): save the image again") from None
        entry = _pick_entry(entries, ref, p)
        config_name, layer_names = entry.get("Config"), entry.get("Layers")
        if not isinstance(config_name, str) or not isinstance(layer_names, list) \
                or not all(isinstance(n, str) for n in layer_names):
            raise ImageCorrupt(f"manifest.json of {p} lacks Config or Layers: save the image again")
        config = src.read(config_name)
        config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
        named = _digest_in_name(config_name)
        if named:
            verify_bytes(config, named, f"config {config_name} of {p}")
        for desc in (entry.get("LayerSources") or {}).values():
            if isinstance(desc, dict):
                check_layer_media_type(str(desc.get("mediaType")), f"layer {desc.get('digest')} of {p}")
        layers = [LayerBlob("", _digest_in_name(n), _opener(src, n), f"{n} of {p}") for n in layer_names]
        return import_image(store, name=str(p), config_digest=config_digest, config_bytes=config,
                            layers=layers, source=f"docker-archive:{p}")


def import_oci_layout(store: ImageStore, path: str | os.PathLike[str], ref: str | None = None) -> ImageMeta:
    """Imports an image from an OCI image layout: a directory, or a tar (optionally gzip) of
    one, and returns its ImageMeta.

    ref: the image's `org.opencontainers.image.ref.name` annotation in index.json (e.g. "v1"
      for `oci:DIR:v1`); by default the first image for this host's platform.

    Raises ImageNotFound (no such path; no image named `ref`), ImageCorrupt (missing blob,
    digest mismatch, malformed JSON or tar), UnsupportedImage (not an OCI layout, no image for
    this platform, unsupported media types), ResourceExhausted.
    """
    p = Path(path)
    with _open_source(p, "OCI layout") as src:
        return _import_layout(store, src, ref, f"oci-layout:{p}")


# ---- OCI layouts ------------------------------------------------------------------------------

def _import_layout(store: ImageStore, src: "_Source", ref: str | None, source: str) -> ImageMeta:
    label = src.label
    if not src.has("oci-layout"):
        raise UnsupportedImage(f"{label} is not an OCI image layout (it has no oci-layout file): export "
                               "one with `skopeo copy IMAGE oci:DIR:TAG`")
    version = parse_json(src.read("oci-layout"), f"oci-layout of {label}").get("imageLayoutVersion")
    if not isinstance(version, str) or not version.startswith("1."):
        raise UnsupportedImage(f"{label}: OCI image layout version {version!r} is not supported (expected 1.x)")
    descs = parse_index(parse_json(src.read("index.json"), f"index.json of {label}"), f"index.json of {label}")
    if ref is not None:
        names = [d.annotations.get(ANNOTATION_REF_NAME) or d.annotations.get(_CONTAINERD_NAME) for d in descs]
        chosen = [d for d in descs if ref in (d.annotations.get(ANNOTATION_REF_NAME), d.annotations.get(_CONTAINERD_NAME))]
        if not chosen:
            have = ", ".join(repr(n) for n in names if n) or "no named images"
            raise ImageNotFound(f"{label} has no image named {ref!r} (it has {have}): pass one of those as ref")
        descs = chosen
    if not descs:
        raise ImageNotFound(f"{label}: index.json lists no images")
    manifest, config = _resolve(src, descs, label, 0)
    layers = [LayerBlob(d.media_type, d.digest, _opener(src, _blob_path(d.digest, label)), f"{d.digest} of {label}")
              for d in manifest.layers]
    name = f"{label}:{ref}" if ref else label
    return import_image(store, name=name, config_digest=manifest.config.digest, config_bytes=config,
                        layers=layers, source=source)


def _resolve(src: "_Source", descs: list[Descriptor], label: str, depth: int) -> tuple[Manifest, bytes]:
    """The first manifest among `descs` (through nested indexes) for this host's platform,
    judged by the descriptor's platform or else by its config; with that config's bytes."""
    want = host_platform()
    seen: list[str] = []
    for d in descs:
        if d.platform and (d.platform.get("os"), d.platform.get("architecture")) != want:
            seen.append(d.platform_name)
            continue
        obj = parse_json(_read_blob(src, d, label), f"manifest {d.digest} of {label}")
        if manifest_kind(obj, d.media_type) == "index":
            if depth >= MAX_INDEX_DEPTH:
                raise ImageCorrupt(f"{label}: image indexes nest deeper than {MAX_INDEX_DEPTH}; the layout is malformed")
            try:
                return _resolve(src, parse_index(obj, f"index {d.digest} of {label}"), label, depth + 1)
            except UnsupportedImage as e:
                if len(descs) == 1:
                    raise
                seen.append(str(e))
                continue
        manifest = parse_manifest(obj, f"{label} ({d.digest})")
        config = _read_blob(src, manifest.config, label)
        cfg = parse_json(config, f"config {manifest.config.digest} of {label}")
        plat = (cfg.get("os", want[0]), cfg.get("architecture", want[1]))
        if plat == want:
            return manifest, config
        seen.append(f"{plat[0]}/{plat[1]}")
    raise UnsupportedImage(f"{label} has no {want[0]}/{want[1]} image (it has: {', '.join(seen) or 'none'}): "
                           f"export the {want[0]}/{want[1]} variant")


def _read_blob(src: "_Source", desc: Descriptor, label: str) -> bytes:
    if desc.size > MAX_JSON_BYTES:
        raise ImageCorrupt(f"{label}: blob {desc.digest} ({desc.media_type}) declares {desc.size} bytes, "
                           f"more than {MAX_JSON_BYTES}; the layout is malformed")
    data = src.read(_blob_path(desc.digest, label))
    verify_bytes(data, desc.digest, f"blob {desc.digest} of {label}")
    return data


def _blob_path(digest: str, label: str) -> str:
    algo, hexpart = split_digest(digest, f"blob of {label}")
    return f"blobs/{algo}/{hexpart}"


# ---- docker save archives --------------------------------------------------------------------

def _pick_entry(entries: Any, ref: str | None, path: Path) -> dict[str, Any]:
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ImageCorrupt(f"manifest.json of {path} is not a list of images: save the image again")
    if ref is None:
        first: dict[str, Any] = entries[0]
        return first
    wanted = {ref, ref + ":latest"} if ":" not in ref.rsplit("/", 1)[-1] else {ref}
    for e in entries:
        if wanted & set(e.get("RepoTags") or []):
            found: dict[str, Any] = e
            return found
    have = ", ".join(t for e in entries for t in (e.get("RepoTags") or [])) or "only untagged images"
    raise ImageNotFound(f"{path} has no image tagged {ref!r} (it has {have}): pass one of those as ref")


def _digest_in_name(name: str) -> str | None:
    """The digest a member name states: blobs/<alg>/<hex> or a legacy "<sha256 hex>.json"
    config; legacy "<v1 id>/layer.tar" names carry none."""
    n = posixpath.normpath(name.lstrip("/"))
    m = _BLOB_NAME.fullmatch(n)
    if m:
        return f"{m.group(1)}:{m.group(2)}"
    m = _LEGACY_CONFIG.fullmatch(n)
    return f"sha256:{m.group(1)}" if m else None


# ---- where the files come from: a directory or a tar ------------------------------------------

class _Source:
    """Files of an archive by relative path; `read` is for small JSON files."""

    label: str

    def has(self, rel: str) -> bool:
        raise NotImplementedError

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def open(self, rel: str) -> AbstractContextManager[BinaryIO]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def missing(self, rel: str) -> ImageCorrupt:
        return ImageCorrupt(f"{rel} is missing from {self.label}: the archive is incomplete; export the image again")


def _clean(rel: str) -> str | None:
    """A relative path inside the archive, or None when it would leave it."""
    n = posixpath.normpath(rel.lstrip("/"))
    return None if n == ".." or n.startswith("../") or n == "." else n


class _DirSource(_Source):
    def __init__(self, root: Path) -> None:
        self.root, self.label = root, str(root)

    def _path(self, rel: str) -> Path:
        n = _clean(rel)
        if n is None:
            raise ImageCorrupt(f"{self.label} names {rel!r}, which is outside it; the archive is malformed")
        return self.root / n

    def has(self, rel: str) -> bool:
        return self._path(rel).is_file()

    def read(self, rel: str) -> bytes:
        try:
            with open(self._path(rel), "rb") as f:
                data = f.read(MAX_JSON_BYTES + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self.missing(rel) from None
        if len(data) > MAX_JSON_BYTES:
            raise ImageCorrupt(f"{rel} of {self.label} is larger than {MAX_JSON_BYTES} bytes; the archive is malformed")
        return data

    @contextmanager
    def open(self, rel: str) -> Iterator[BinaryIO]:
        try:
            f = open(self._path(rel), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self.missing(rel) from None
        with f:
            yield f


class _TarSource(_Source):
    def __init__(self, path: Path) -> None:
        self.label = str(path)
        try:
            self.tf = tarfile.open(path, "r:*")
            members = self.tf.getmembers()
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ImageCorrupt(f"{path} is not a readable tar archive ({e}): check the file, or export it again") from None
        self.members: dict[str, tarfile.TarInfo] = {}
        for m in members:
            n = _clean(m.name)
            if n is not None:
                self.members[n] = m
        # A tar of the layout's directory itself ("DIR/oci-layout"): look inside that directory.
        self.prefix = ""
        if not any(k in self.members for k in ("oci-layout", "manifest.json", "index.json")):
            tops = {k.split("/", 1)[0] for k in self.members}
            if len(tops) == 1:
                top = tops.pop()
                if f"{top}/oci-layout" in self.members or f"{top}/manifest.json" in self.members:
                    self.prefix = top + "/"

    def _member(self, rel: str) -> tarfile.TarInfo:
        n = _clean(rel)
        m = self.members.get(self.prefix + n) if n is not None else None
        if m is None or not (m.isfile() or m.issym() or m.islnk()):
            raise self.missing(rel)
        return m

    def has(self, rel: str) -> bool:
        try:
            self._member(rel)
        except ImageCorrupt:
            return False
        return True

    def _extract(self, rel: str) -> BinaryIO:
        try:
            f = self.tf.extractfile(self._member(rel))
        except (KeyError, tarfile.TarError) as e:  # a link to a member that is not there
            raise ImageCorrupt(f"{rel} of {self.label} is a broken link ({e}); the archive is malformed") from None
        if f is None:
            raise self.missing(rel)
        return f  # type: ignore[return-value]

    def read(self, rel: str) -> bytes:
        f = self._extract(rel)
        try:
            data = f.read(MAX_JSON_BYTES + 1)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ImageCorrupt(f"{rel} of {self.label} is truncated ({e}): export the image again") from None
        if len(data) > MAX_JSON_BYTES:
            raise ImageCorrupt(f"{rel} of {self.label} is larger than {MAX_JSON_BYTES} bytes; the archive is malformed")
        return data

    @contextmanager
    def open(self, rel: str) -> Iterator[BinaryIO]:
        f = self._extract(rel)
        try:
            yield f
        finally:
            f.close()

    def close(self) -> None:
        self.tf.close()


@contextmanager
def _open_source(path: Path, kind: str) -> Iterator[_Source]:
    if not path.exists():
        raise ImageNotFound(f"{kind} {path} not found: check the path")
    src: _Source = _DirSource(path) if path.is_dir() else _TarSource(path)
    try:
        yield src
    finally:
        src.close()


def _opener(src: _Source, rel: str) -> Callable[[], AbstractContextManager[BinaryIO]]:
    """Opens a layer member; docker archives do not record whether a layer is compressed, so
    the media type of a LayerBlob with none is detected by layers.store_layer."""
    return lambda: src.open(rel)

