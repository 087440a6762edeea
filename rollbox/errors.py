"""The rollbox exception tree. Every error says what failed and what to do about it.

    RollboxError
    ├── InvalidArgument
    │   ├── UnsupportedImage     (a media type, platform or archive layout rollbox cannot use)
    │   ├── NotAPty              (a terminal resize of a background process started without pty=True)
    │   └── ImageBuildError      (a build step's command failed; carries its output)
    ├── NotFound
    │   ├── SandboxNotFound
    │   ├── SnapshotNotFound
    │   ├── ImageNotFound
    │   ├── VolumeNotFound
    │   ├── ContainerNotFound    (an episode container that ended or never existed)
    │   ├── EpisodePoolNotFound
    │   └── ProcessNotFound      (a background-process pid the sandbox's agent does not know)
    ├── InvalidState             (e.g. exec on a terminated sandbox)
    │   ├── UnsupportedOperation (the sandbox's runtime cannot do it, e.g. a runc memory snapshot)
    │   ├── StdinClosed          (a write to a background process's stdin after it was closed)
    │   ├── VolumeBusy           (a read-write mount beside a gVisor writer of the same volume)
    │   └── SandboxTerminated
    │       └── FunctionTimeout  (a remote function ran past its timeout; its sandbox was killed)
    ├── SandboxLost              (died or unreachable: an infrastructure fault, retryable)
    ├── AgentFailed              (the in-sandbox agent could not do an operation; its kind says why)
    ├── RuntimeMissing           (runsc or a host prerequisite is absent; carries the fix)
    ├── ResourceExhausted        (disk full, too many sandboxes)
    ├── ResourceUnavailable      (not on this machine at all, e.g. a GPU)
    ├── Unauthorized             (the TCP listener's bearer token is missing or wrong)
    ├── DaemonUnavailable        (no daemon answers and none could be started)
    ├── ImagePullError           (a registry or image source failed; retryable)
    │   └── ImageCorrupt         (digest mismatch, truncated or malformed archive)
    └── ApiError                 (an unmapped daemon failure; carries status and code)

Errors cross the HTTP boundary as `{"code": ..., "message": ..., "sandbox_id": ...}`; `CODES`
maps a code back to its class, so the SDK raises the same type the daemon did.
"""

from __future__ import annotations


class RollboxError(Exception):
    """Base class of every rollbox error.

    Attributes:
        sandbox_id: the sandbox the error is about, or None.
        retryable: True when the same call may succeed on a fresh sandbox (infrastructure faults).
    """

    code = "internal"
    status = 500
    retryable = False

    def __init__(self, message: str, *, sandbox_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sandbox_id = sandbox_id

    def to_wire(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "sandbox_id": self.sandbox_id}


class InvalidArgument(RollboxError):
    code, status = "invalid_argument", 400


class NotFound(RollboxError):
    code, status = "not_found", 404


class SandboxNotFound(NotFound):
    code = "sandbox_not_found"


class SnapshotNotFound(NotFound):
    code = "snapshot_not_found"


class ImageNotFound(NotFound):
    code = "image_not_found"


class VolumeNotFound(NotFound):
    code = "volume_not_found"


class ContainerNotFound(NotFound):
    """An episode container (SandboxPool isolation="container") that ended or never existed."""

    code = "container_not_found"


class EpisodePoolNotFound(NotFound):
    """An episode pool id the daemon does not know (closed, or made by another daemon)."""

    code = "episode_pool_not_found"


class FileNotFoundInSandbox(NotFound):
    code = "file_not_found"


class InvalidState(RollboxError):
    code, status = "invalid_state", 409


class UnsupportedOperation(InvalidState):
    """The sandbox's runtime cannot do this (e.g. memory snapshots of a runc sandbox)."""

    code = "unsupported_operation"


class VolumeBusy(InvalidState):
    """A read-write volume mount was refused: another sandbox mounts the volume read-write and
    one of the two is gVisor, whose concurrent writes to one file are not kept intact."""

    code = "volume_busy"


class SandboxTerminated(InvalidState):
    code = "sandbox_terminated"


class FunctionTimeout(SandboxTerminated):
    """A remote function ran past its `timeout`; its sandbox was killed."""

    code = "function_timeout"


class ProcessNotFound(NotFound):
    """No background process with that pid was started through the API in this sandbox (or it
    ended long enough ago to be forgotten: the 64 most recent ended ones are kept 600 s)."""

    code = "process_not_found"


class StdinClosed(InvalidState):
    """A write to a background process's stdin after `stdin.close()` (or after it ended)."""

    code = "stdin_closed"


class NotAPty(InvalidArgument):
    """A terminal operation (resize) on a background process started without `pty=True`."""

    code = "not_a_pty"


class SandboxLost(RollboxError):
    code, status, retryable = "sandbox_lost", 502, True


class AgentFailed(RollboxError):
    """The agent inside the sandbox could not do the operation for a reason of the sandbox's own
    (e.g. it cannot make a thread or a pipe, or an OS error it has no better code for); the
    message carries its kind and the OS error. Not retryable as such: the same call on the same
    sandbox likely fails the same way (a fresh sandbox may not)."""

    code, status = "agent_error", 500


class RuntimeMissing(RollboxError):
    code, status = "runtime_missing", 503


class ResourceUnavailable(RollboxError):
    """This machine does not have what was asked for (e.g. a GPU): never silently run without."""

    code, status = "resource_unavailable", 503


class ResourceExhausted(RollboxError):
    code, status, retryable = "resource_exhausted", 507, True


class DaemonUnavailable(RollboxError):
    code, status, retryable = "daemon_unavailable", 503, True


class ApiError(RollboxError):
    code, status = "api_error", 500


class ImageBuildError(InvalidArgument):
    """An image build step failed (its command exited non-zero); the message has its output."""

    code = "image_build_failed"


class ImagePullError(RollboxError):
    """A registry or image source failed (down, refused, interrupted); a retry may succeed."""

    code, status, retryable = "image_pull_failed", 502, True


class ImageCorrupt(ImagePullError):
    """A blob's content does not match its digest, or an archive is truncated or malformed."""

    code, retryable = "image_corrupt", False


class UnsupportedImage(InvalidArgument):
    """A manifest or layer media type, platform or archive layout rollbox cannot use."""

    code = "unsupported_image"


class Unauthorized(RollboxError):
    """The daemon's TCP listener refused the request: no or a wrong bearer token
    (set ROLLBOX_TOKEN to the daemon's token, `ROLLBOX_HOME/token` on its host)."""

    code, status = "unauthorized", 401


CODES: dict[str, type[RollboxError]] = {
    cls.code: cls
    for cls in (
        RollboxError, InvalidArgument, NotFound, SandboxNotFound, SnapshotNotFound, ImageNotFound,
        VolumeNotFound, FileNotFoundInSandbox, InvalidState, SandboxTerminated, SandboxLost, RuntimeMissing,
        ResourceExhausted, DaemonUnavailable, ApiError, ImagePullError, ImageCorrupt, UnsupportedImage,
        ImageBuildError, FunctionTimeout, ResourceUnavailable, Unauthorized, UnsupportedOperation, VolumeBusy,
        ContainerNotFound, EpisodePoolNotFound, AgentFailed, ProcessNotFound, StdinClosed, NotAPty,
    )
}


def from_wire(body: dict[str, object], status: int) -> RollboxError:
    """Rebuilds the typed error a daemon sent; unknown codes become `ApiError`."""
    cls = CODES.get(str(body.get("code")), ApiError)
    sid = body.get("sandbox_id")
    err = cls(str(body.get("message", f"daemon answered HTTP {status}")),
              sandbox_id=str(sid) if sid else None)
    return err
