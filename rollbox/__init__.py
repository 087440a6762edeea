"""rollbox: gVisor sandboxes, memory snapshots and fan-out for RL rollouts.

    from rollbox import Sandbox, Image, SandboxPool
"""

from .version import __version__

from .errors import (  # noqa: E402
    AgentFailed,
    ApiError,
    ContainerNotFound,
    DaemonUnavailable,
    EpisodePoolNotFound,
    FileNotFoundInSandbox,
    FunctionTimeout,
    ImageBuildError,
    ImageCorrupt,
    ImageNotFound,
    ImagePullError,
    InvalidArgument,
    InvalidState,
    NotAPty,
    NotFound,
    ProcessNotFound,
    ResourceExhausted,
    ResourceUnavailable,
    Unauthorized,
    RollboxError,
    RuntimeMissing,
    SandboxLost,
    SandboxNotFound,
    SandboxTerminated,
    SnapshotNotFound,
    StdinClosed,
    UnsupportedImage,
    UnsupportedOperation,
    VolumeBusy,
    VolumeNotFound,
)
from .distributed import init  # noqa: E402
from .sdk.function import Function, FunctionError, function  # noqa: E402
from .sdk.image import Image  # noqa: E402
from .sdk.pool import SandboxPool  # noqa: E402
from .sdk.process import CodeError, CodeResult, ProcessInfo, SandboxProcess, SandboxProcesses  # noqa: E402
from .sdk.sandbox import Sandbox, SandboxInstance  # noqa: E402
from .sdk.volume import Volume  # noqa: E402
from .types import EpisodeResult, ExecResult, FileEntry, SandboxInfo  # noqa: E402

__all__ = [
    "AgentFailed",
    "ApiError",
    "CodeError",
    "CodeResult",
    "ContainerNotFound",
    "DaemonUnavailable",
    "EpisodePoolNotFound",
    "EpisodeResult",
    "ExecResult",
    "FileEntry",
    "FileNotFoundInSandbox",
    "Function",
    "FunctionError",
    "FunctionTimeout",
    "Image",
    "ImageBuildError",
    "ImageCorrupt",
    "ImageNotFound",
    "ImagePullError",
    "InvalidArgument",
    "InvalidState",
    "NotAPty",
    "NotFound",
    "ProcessInfo",
    "ProcessNotFound",
    "ResourceExhausted",
    "ResourceUnavailable",
    "RollboxError",
    "RuntimeMissing",
    "Sandbox",
    "SandboxInfo",
    "SandboxInstance",
    "SandboxLost",
    "SandboxNotFound",
    "SandboxPool",
    "SandboxProcess",
    "SandboxProcesses",
    "SandboxTerminated",
    "SnapshotNotFound",
    "StdinClosed",
    "Unauthorized",
    "UnsupportedImage",
    "UnsupportedOperation",
    "Volume",
    "VolumeBusy",
    "VolumeNotFound",
    "__version__",
    "function",
    "init",
]
