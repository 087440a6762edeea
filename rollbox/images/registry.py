"""Pulling images from an OCI/Docker registry (Docker Registry HTTP API v2) into the image store.

Follows the OCI distribution-spec "Pull" workflow
(https://github.com/opencontainers/distribution-spec/blob/main/spec.md#pull):
GET /v2/<name>/manifests/<tag|digest> (an index or Docker manifest list is resolved to this
host's platform, linux/amd64 on x86-64), then GET /v2/<name>/blobs/<digest> for the config and
each missing layer. Blobs stream to a staging file while their digest is computed, then
layers.py unpacks them; nothing half-written is ever left in the store.

Authentication: a 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…` is answered
with a token from the realm (Docker's token protocol,
https://distribution.github.io/distribution/spec/auth/token/), using the credentials when
given; a `Basic` challenge with HTTP Basic credentials. Connection failures, timeouts, 429 and
5xx answers are retried with backoff (`RETRY_DELAYS`, through tenacity); an interrupted blob
download resumes with a Range request when the registry supports it.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx
import tenacity

from ..errors import (ImageCorrupt, ImageNotFound, ImagePullError, InvalidArgument, ResourceExhausted,
                      RollboxError)
from ..runtime.rootfs import remove_tree
from .layers import LayerBlob, import_image
from .manifest import (INDEX_TYPES, MANIFEST_TYPES, MAX_JSON_BYTES, Descriptor, Manifest, image_id_for,
                       manifest_kind, parse_index, parse_json, parse_manifest, pick_platform, split_digest,
                       verify_bytes)
from .store import ImageMeta, ImageStore

DOCKER_HUB = "registry-1.docker.io"
_HUB_ALIASES = ("docker.io", "index.docker.io", DOCKER_HUB)
# Seconds to wait before each retry of a failed request (len = number of retries).
RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
TIMEOUT = httpx.Timeout(60.0, connect=10.0)  # seconds; read = longest silence within a response
ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)
USER_AGENT = "rollbox"
MAX_INDEX_DEPTH = 4  # an index may name an index; nobody nests deeper


class _RetryStatus(Exception):
    """A registry answer worth another try (RETRY_STATUSES); carries what the error needs."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


def _retrying(*retry_on: type[BaseException]) -> tenacity.Retrying:
    """Tenacity's loop for one request: a try, then one retry per RETRY_DELAYS entry (read at
    each call, so tests can shorten it), retrying only `retry_on`; the last failure is raised."""
    delays = RETRY_DELAYS
    return tenacity.Retrying(stop=tenacity.stop_after_attempt(len(delays) + 1),
                             # tenacity asks for the wait before it checks the stop: past the table, 0
                             wait=lambda state: delays[state.attempt_number - 1] if state.attempt_number <= len(delays)
                             else 0.0,
                             retry=tenacity.retry_if_exception_type(retry_on), reraise=True)

# distribution/reference grammar (https://github.com/distribution/reference/blob/main/reference.go).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_HOST_RE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                      r"|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?")
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}")
_SHA256_RE = re.compile(r"sha256:[a-f0-9]{64}")


@dataclass(frozen=True)
class Reference:
    """A parsed image reference: registry host[:port], repository path, tag and/or digest."""

    registry: str  # e.g. "registry-1.docker.io", "127.0.0.1:5000"
    repository: str  # e.g. "library/debian"
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def is_loopback(self) -> bool:
        host = self.registry.rsplit(":", 1)[0] if not self.registry.startswith("[") else self.registry.split("]")[0] + "]"
        return host in ("localhost", "127.0.0.1", "[::1]")

    def __str__(self) -> str:
        s = f"{self.registry}/{self.repository}"
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s


def parse_reference(ref: str) -> Reference:
    """Parses `[host[:port]/]path[:tag][@sha256:<hex>]` as docker does: the first component is
    a registry host when it has a dot or a port or is "localhost"; otherwise the image is on
    Docker Hub (registry-1.docker.io), where a one-component name is under "library/". Without
    a tag or digest the tag is "latest". Raises InvalidArgument naming what is wrong."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"{ref!r} is not an image reference: {why} "
                               "(expected e.g. 'debian:12', 'ghcr.io/org/app:v1' or 'localhost:5000/app@sha256:…')")

    if not isinstance(ref, str) or not ref or ref != ref.strip() or len(ref) > 512:
        raise bad("it is empty, too long or has surrounding spaces")
    name, digest = ref, None
    if "@" in ref:
        name, digest = ref.split("@", 1)
        try:
            split_digest(digest, "reference")
        except RollboxError:
            raise bad(f"{digest!r} is not a digest") from None
    tag = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG_RE.fullmatch(tag):
            raise bad(f"{tag!r} is not a valid tag")
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _HOST_RE.fullmatch(first):
            raise bad(f"{first!r} is not a registry host")
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, name
    if host.lower() in _HUB_ALIASES:
        host = DOCKER_HUB
        if "/" not in path:
            path = "library/" + path
    if not _PATH_RE.fullmatch(path) or len(path) > 255:
        raise bad(f"{path!r} is not a repository name (lowercase letters, digits and . _ - separators)")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(host, path, tag, digest)


def pull(store: ImageStore, reference: str, credentials: tuple[str, str] | None = None,
         insecure: bool = False, *, transport: httpx.BaseTransport | None = None) -> ImageMeta:
    """Pulls `reference` (see `parse_reference`) into `store` and returns its ImageMeta.

    credentials: (user, password or token) for registries that require them.
    insecure: plain HTTP (and no certificate check) for a non-loopback registry; loopback
      registries (localhost, 127.0.0.1, [::1]) are always spoken to over plain HTTP.
    transport: an httpx transport to use instead of the network (tests).

    Idempotent: the image id comes from the config digest, so pulling an image that is already
    in the store fetches only its manifest, and layers already present are not downloaded.

    Raises InvalidArgument (bad reference), ImageNotFound (unknown repository, tag or blob),
    ImagePullError (registry unreachable, 5xx, rate limited, authentication failed),
    ImageCorrupt (digest mismatch, malformed manifest, truncated layer), UnsupportedImage
    (media type, schema 1, no platform for this host, foreign layers), ResourceExhausted.
    """
    ref = parse_reference(reference)
    with RegistryClient(ref, credentials, insecure, transport=transport) as reg:
        manifest = reg.resolve_manifest()
        image_id = image_id_for(manifest.config.digest)
        if store.exists(image_id):
            return store.meta(image_id)
        config = reg.blob_bytes(manifest.config, "config")
        layers = [LayerBlob(d.media_type, d.digest, _opener(reg, store, d), f"{d.digest} of {ref}")
                  for d in manifest.layers]
        return import_image(store, name=str(ref), config_digest=manifest.config.digest,
                            config_bytes=config, layers=layers, source=f"registry:{ref}")


def _opener(reg: "RegistryClient", store: ImageStore,
            desc: Descriptor) -> Callable[[], AbstractContextManager[BinaryIO]]:
    """Downloads the layer blob to a staging file when opened; removes it when closed."""
    @contextmanager
    def open_blob() -> Iterator[BinaryIO]:
        staging = store.staging_dir("blob")
        try:
            path = staging / "blob"
            reg.download_blob(desc, path)
            with open(path, "rb") as f:
                yield f
        finally:
            remove_tree(staging)
    return open_blob


class RegistryClient:
    """One repository on one registry, over httpx, with auth, retries and digest checks."""

    def __init__(self, ref: Reference, credentials: tuple[str, str] | None = None, insecure: bool = False,
                 *, transport: httpx.BaseTransport | None = None) -> None:
        self.ref = ref
        self.credentials = credentials
        self.scheme = "http" if insecure or ref.is_loopback else "https"
        self.base = f"{self.scheme}://{ref.registry}/v2/{ref.repository}"
        self._auth: str | None = None  # the Authorization header the registry accepted
        self._auth_kind = ""  # "bearer-anonymous" | "bearer" | "basic"
        self._client = httpx.Client(timeout=TIMEOUT, follow_redirects=True, verify=not insecure,
                                    headers={"User-Agent": USER_AGENT}, transport=transport)

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    # ---- manifests ---------------------------------------------------------------------------

    def resolve_manifest(self) -> Manifest:
        """The image manifest for the reference, through indexes to this host's platform."""
        reference, what = self.ref.reference, str(self.ref)
        for _ in range(MAX_INDEX_DEPTH):
            data, content_type = self.manifest_bytes(reference, what)
            obj = parse_json(data, f"manifest of {what}")
            if manifest_kind(obj, content_type) == "manifest":
                return parse_manifest(obj, what)
            chosen = pick_platform(parse_index(obj, f"index of {what}"), what)
            reference, what = chosen.digest, f"{self.ref} ({chosen.platform_name})"
        raise ImageCorrupt(f"{self.ref}: image indexes nest deeper than {MAX_INDEX_DEPTH}; the image is malformed")

    def manifest_bytes(self, reference: str, what: str) -> tuple[bytes, str]:
        """(body, Content-Type) of GET /manifests/<reference>, verified against the digest when
        `reference` is one, or against the registry's Docker-Content-Digest header."""
        resp = self._get(f"{self.base}/manifests/{reference}", f"manifest of {what}", "manifest",
                         {"Accept": ACCEPT})
        try:
            data = self._read_limited(resp, f"manifest of {what}")
        finally:
            resp.close()
        # A tag has no ":", a digest does. For a tag, the registry's Docker-Content-Digest
        # header (the digest of the body it sent) is checked when it is a well-formed sha256.
        expected = reference if ":" in reference else resp.headers.get("Docker-Content-Digest", "")
        if ":" in reference or _SHA256_RE.fullmatch(expected):
            verify_bytes(data, expected, f"manifest of {what}")
        return data, resp.headers.get("Content-Type", "").split(";")[0].strip()

    # ---- blobs -------------------------------------------------------------------------------

    def blob_bytes(self, desc: Descriptor, kind: str) -> bytes:
        """A small blob (the config) in memory, digest-verified."""
        if desc.size > MAX_JSON_BYTES:
            raise ImageCorrupt(f"{kind} {desc.digest} of {self.ref} declares {desc.size} bytes, more than "
                               f"{MAX_JSON_BYTES}; the image is malformed")
        what = f"{kind} {desc.digest} of {self.ref}"
        resp = self._get(f"{self.base}/blobs/{desc.digest}", what, "blob")
        try:
            data = self._read_limited(resp, what, desc.size)
        finally:
            resp.close()
        verify_bytes(data, desc.digest, what)
        return data

    def download_blob(self, desc: Descriptor, path: Path) -> None:
        """Streams blob `desc` to `path`, checking its size and digest; an interrupted download
        is retried, resuming with a Range request when the registry answers 206."""
        what = f"layer {desc.digest} of {self.ref}"
        algo, hexpart = split_digest(desc.digest, what)
        h = hashlib.new(algo)
        done = 0
        with open(path, "wb") as f:
            try:
                for attempt in _retrying(httpx.TransportError):  # a cut mid-stream: resume
                    with attempt:
                        if done and done == desc.size:
                            break  # cut right at the end: nothing left to ask for
                        # identity: byte ranges then count bytes of the blob itself, not of a re-encoding.
                        headers = {"Accept-Encoding": "identity"}
                        if done:
                            headers["Range"] = f"bytes={done}-"
                        resp = self._get(f"{self.base}/blobs/{desc.digest}", what, "blob", headers)
                        try:
                            if done and resp.status_code != 206:  # no range support: start over
                                f.seek(0)
                                f.truncate()
                                h, done = hashlib.new(algo), 0
                            for chunk in resp.iter_bytes():  # as received: a cut keeps what came
                                done += len(chunk)
                                if done > desc.size:
                                    raise ImageCorrupt(f"{what}: the registry sent more than the {desc.size} bytes "
                                                       "the manifest declares; the image is corrupt: push it again")
                                h.update(chunk)
                                f.write(chunk)
                        except OSError as e:
                            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                                raise ResourceExhausted(f"disk full while downloading {what}: free space under "
                                                        f"{path.parent.parent}") from e
                            raise
                        finally:
                            resp.close()
            except httpx.TransportError as e:
                raise ImagePullError(f"download of {what} from {self.ref.registry} was interrupted "
                                     f"{len(RETRY_DELAYS) + 1} times ({type(e).__name__}: {e}): retry later") from e
        if done != desc.size:
            raise ImageCorrupt(f"{what}: got {done} bytes, the manifest declares {desc.size}; the blob on the "
                               "registry is truncated or corrupt: push the image again")
        if h.hexdigest() != hexpart:
            raise ImageCorrupt(f"{what}: content does not match its digest (got {algo}:{h.hexdigest()}); the "
                               "registry's copy is corrupt or was altered in transit: retry, or push the image again")

    # ---- HTTP --------------------------------------------------------------------------------

    def _read_limited(self, resp: httpx.Response, what: str, size: int | None = None) -> bytes:
        limit = size if size is not None else MAX_JSON_BYTES
        buf = bytearray()
        try:
            for chunk in resp.iter_bytes():
                buf += chunk
                if len(buf) > limit:
                    raise ImageCorrupt(f"{what} is larger than {limit} bytes; the image is malformed or corrupt")
        except httpx.TransportError as e:
            raise ImagePullError(f"reading {what} from {self.ref.registry} was interrupted ({e}): retry") from e
        return bytes(buf)

    def _get(self, url: str, what: str, kind: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """GET `url` with auth and retries; returns a 2xx response, open for streaming (the
        caller closes it), or raises the typed error for the failure. Connection failures and
        RETRY_STATUSES answers are retried (`_retrying`); a 401 is answered once per call."""
        auth_tried: list[bool] = []
        try:
            for attempt in _retrying(httpx.TransportError, _RetryStatus):
                with attempt:
                    return self._get_once(url, what, kind, headers, auth_tried)
        except httpx.TransportError as e:
            hint = ("; if it serves plain HTTP, pass insecure=True" if self.scheme == "https"
                    and "SSL" in str(e).upper() else "")
            raise ImagePullError(f"cannot reach registry {self.ref.registry} for {what} after {len(RETRY_DELAYS) + 1} "
                                 f"tries ({type(e).__name__}: {e}): check that it is running and reachable"
                                 f"{hint}, then retry") from e
        except _RetryStatus as e:
            raise self._status_error(e.status, e.body, what, kind) from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _get_once(self, url: str, what: str, kind: str, headers: dict[str, str] | None,
                  auth_tried: list[bool]) -> httpx.Response:
        """One try of `_get` (a 401 answered and sent again within it). Raises
        httpx.TransportError or _RetryStatus for `_get` to retry, else the typed error."""
        while True:
            h = dict(headers or {})
            if self._auth:
                h["Authorization"] = self._auth
            try:
                resp = self._client.send(self._client.build_request("GET", url, headers=h), stream=True)
            except httpx.TransportError:
                raise
            except httpx.HTTPError as e:  # e.g. too many redirects
                raise ImagePullError(f"fetching {what} from {self.ref.registry} failed: {e}") from e
            if resp.status_code < 300:
                return resp
            try:
                body = resp.read()
            except httpx.HTTPError:
                body = b""
            finally:
                resp.close()
            if resp.status_code == 401 and not auth_tried:
                self._authenticate(resp.headers.get("WWW-Authenticate", ""), what)
                auth_tried.append(True)
                continue
            if resp.status_code in RETRY_STATUSES:
                raise _RetryStatus(resp.status_code, body)
            raise self._status_error(resp.status_code, body, what, kind)

    def _status_error(self, status: int, body: bytes, what: str, kind: str) -> RollboxError:
        codes, message = _registry_errors(body)
        detail = f" ({message})" if message else ""
        reg, repo = self.ref.registry, self.ref.repository
        if status == 404:
            if "NAME_UNKNOWN" in codes:
                return ImageNotFound(f"repository {repo} not found on {reg}{detail}: check the image name")
            if kind == "manifest":
                return ImageNotFound(f"{what} not found on {reg}: no tag or digest {self.ref.reference!r} in "
                                     f"{repo}{detail}; check the tag")
            return ImageNotFound(f"{what} is missing on {reg}{detail}: the image there is incomplete; push it again")
        if status == 401:
            if self._auth_kind == "bearer-anonymous":
                # Docker Hub answers so for private and for nonexistent repositories alike.
                return ImageNotFound(f"{repo} on {reg}: access denied without credentials{detail}; the repository "
                                     "does not exist or is private: check the name, or pass credentials=(user, password)")
            return ImagePullError(f"authentication to {reg} failed for {what}{detail}: check the user name and "
                                  "password (or token) in credentials")
        if status == 403:
            return ImagePullError(f"access to {repo} on {reg} denied (HTTP 403){detail}: check that the credentials "
                                  "may pull this repository")
        if status == 429:
            return ImagePullError(f"{reg} rate-limited the pull of {what}{detail}: wait and retry, or pass "
                                  "credentials for a higher limit")
        if status >= 500:
            return ImagePullError(f"registry {reg} failed with HTTP {status} for {what}{detail} after "
                                  f"{len(RETRY_DELAYS) + 1} tries: retry later")
        return ImagePullError(f"registry {reg} refused {what} with HTTP {status}{detail}")

    def _authenticate(self, challenge: str, what: str) -> None:
        """Answers a 401's WWW-Authenticate challenge: sets `self._auth` or raises."""
        scheme, _, params_s = challenge.strip().partition(" ")
        params = dict((k.lower(), v if v is not None else "") for k, v in _parse_params(params_s))
        scheme = scheme.lower()
        if scheme == "basic":
            if self.credentials is None:
                raise ImagePullError(f"registry {self.ref.registry} requires credentials for {what}: pass "
                                     "credentials=(user, password)")
            self._auth = "Basic " + _basic(self.credentials)
            self._auth_kind = "basic"
            return
        if scheme != "bearer" or not params.get("realm"):
            raise ImagePullError(f"registry {self.ref.registry} asked for unsupported authentication "
                                 f"{challenge!r} for {what}: only Bearer tokens and Basic are supported")
        realm = params["realm"]
        if not realm.startswith(("https://", "http://")):
            raise ImagePullError(f"registry {self.ref.registry} named an invalid token realm {realm!r}")
        query: dict[str, str] = {}
        if params.get("service"):
            query["service"] = params["service"]
        query["scope"] = params.get("scope") or f"repository:{self.ref.repository}:pull"
        headers = {"Authorization": "Basic " + _basic(self.credentials)} if self.credentials else {}

        def ask() -> httpx.Response:
            resp = self._client.get(realm, params=query, headers=headers)
            if resp.status_code in (401, 403):
                who = f"user {self.credentials[0]!r}" if self.credentials else "anonymous access"
                raise ImagePullError(f"the token service {realm} of {self.ref.registry} refused {who} "
                                     f"(HTTP {resp.status_code}): check the credentials")
            if resp.status_code in RETRY_STATUSES:
                raise _RetryStatus(resp.status_code, b"")
            if resp.status_code >= 300:
                raise ImagePullError(f"the token service {realm} of {self.ref.registry} answered HTTP "
                                     f"{resp.status_code}: retry later")
            return resp

        try:
            resp = _retrying(httpx.TransportError, _RetryStatus)(ask)
        except (httpx.TransportError, _RetryStatus) as last:
            raise ImagePullError(f"cannot get a token from {realm} for {self.ref.registry} ({last}): "
                                 "retry later") from None
        try:
            body = resp.json()
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise ImagePullError(f"the token service {realm} of {self.ref.registry} sent no token")
        self._auth = f"Bearer {token}"
        self._auth_kind = "bearer" if self.credentials else "bearer-anonymous"


def _basic(credentials: tuple[str, str]) -> str:
    user, password = credentials
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _parse_params(s: str) -> list[tuple[str, str]]:
    """`realm="https://…",service="x",scope="repository:a:pull"` -> pairs (RFC 7235 auth-params)."""
    return [(m.group(1), m.group(2) if m.group(2) is not None else m.group(3))
            for m in re.finditer(r'([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))', s)]


def _registry_errors(body: bytes) -> tuple[set[str], str]:
    """The codes and messages of a distribution-spec error body {"errors": [{code, message}]}."""
    try:
        errs = parse_json(body, "error body").get("errors") or []
    except RollboxError:
        return set(), ""
    codes = {str(e.get("code")) for e in errs if isinstance(e, dict)}
    msgs = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs if isinstance(e, dict))
    return codes, msgs[:300]

